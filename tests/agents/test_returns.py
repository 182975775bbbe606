"""Returns and GAE against hand-computed values."""

import pytest
import torch

from agents.returns import calc_gaes, calc_nstep_returns, calc_returns

T = lambda *xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731


def test_calc_returns_hand_computed():
    # G2 = 3; G1 = 2 (episode ends at t=1); G0 = 1 + 0.9 * 2 = 2.8
    ret = calc_returns(T(1, 2, 3), T(0, 1, 0), gamma=0.9)
    torch.testing.assert_close(ret, T(2.8, 2.0, 3.0))


def test_calc_returns_without_done_bootstraps_zero():
    # G2 = 3; G1 = 2 + 0.5 * 3 = 3.5; G0 = 1 + 0.5 * 3.5 = 2.75
    torch.testing.assert_close(calc_returns(T(1, 2, 3), T(0, 0, 0), gamma=0.5), T(2.75, 3.5, 3.0))


def test_calc_returns_gamma_one_is_reward_to_go():
    torch.testing.assert_close(calc_returns(T(1, 1, 1, 1), T(0, 0, 0, 1), gamma=1.0), T(4, 3, 2, 1))


def test_calc_returns_time_major_with_env_dim():
    # (T=2, N=2): env 0 ends at t=0, env 1 runs on
    reward = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    done = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(calc_returns(reward, done, 0.5), torch.tensor([[1.0, 2.0], [2.0, 2.0]]))


# ---------------------------------------------------------------- GAE
# gamma = 0.9, lam = 0.8 (gamma * lam = 0.72). Three steps:
#   t=0 ordinary, t=1 terminated (no bootstrap, trace cut), t=2 truncated (bootstrap, trace cut).
#   delta_0 = 1 + 0.9 * 1.0 - 0.5 = 1.4
#   delta_1 = 2 + 0             - 1.0 = 1.0
#   delta_2 = 3 + 0.9 * 4.0 - 1.5 = 5.1
#   A_2 = 5.1;  A_1 = delta_1 = 1.0 (done);  A_0 = 1.4 + 0.72 * 1.0 = 2.12
REWARD, VALUE, NEXT_VALUE = T(1, 2, 3), T(0.5, 1.0, 1.5), T(1.0, 2.0, 4.0)


def test_gae_hand_computed_with_terminated_and_truncated_steps():
    terminated, done = T(0, 1, 0), T(0, 1, 1)
    adv = calc_gaes(REWARD, VALUE, NEXT_VALUE, terminated, done, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, T(2.12, 1.0, 5.1))


def test_gae_truncated_mid_rollout_cuts_trace_but_bootstraps():
    # t=0 truncated: A_0 = delta_0 = 1.4 (no trace from t=1).
    # t=1 ordinary: A_1 = (2 + 0.9 * 2.0 - 1.0) + 0.72 * A_2 = 2.8 + 0.72 * 5.1 = 6.472
    adv = calc_gaes(REWARD, VALUE, NEXT_VALUE, T(0, 0, 0), T(1, 0, 0), gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, T(1.4, 6.472, 5.1))


def test_gae_lambda_one_no_dones_equals_discounted_td_sum():
    # lam = 1: A_t = sum_k gamma^k delta_{t+k}; deltas 1.4, 2.8, 5.1
    adv = calc_gaes(REWARD, VALUE, NEXT_VALUE, T(0, 0, 0), T(0, 0, 0), gamma=0.9, lam=1.0)
    torch.testing.assert_close(adv, T(1.4 + 0.9 * 2.8 + 0.81 * 5.1, 2.8 + 0.9 * 5.1, 5.1))


def test_gae_lambda_zero_is_one_step_td_error():
    adv = calc_gaes(REWARD, VALUE, NEXT_VALUE, T(0, 1, 0), T(0, 1, 1), gamma=0.9, lam=0.0)
    torch.testing.assert_close(adv, T(1.4, 1.0, 5.1))


def test_gae_envs_are_independent():
    # (T=3, N=2): column 0 is the hand-computed example, column 1 the truncated-first one
    stack = lambda a, b: torch.stack([a, b], dim=1)  # noqa: E731
    adv = calc_gaes(stack(REWARD, REWARD), stack(VALUE, VALUE), stack(NEXT_VALUE, NEXT_VALUE),
                    stack(T(0, 1, 0), T(0, 0, 0)), stack(T(0, 1, 1), T(1, 0, 0)), gamma=0.9, lam=0.8)
    assert adv.shape == (3, 2)
    torch.testing.assert_close(adv[:, 0], T(2.12, 1.0, 5.1))
    torch.testing.assert_close(adv[:, 1], T(1.4, 6.472, 5.1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_keeps_dtype(dtype):
    adv = calc_gaes(*(x.to(dtype) for x in (REWARD, VALUE, NEXT_VALUE, T(0, 1, 0), T(0, 1, 1))), 0.9, 0.8)
    assert adv.dtype == dtype


def test_calc_nstep_returns_hand_computed():
    """r = 1, V(s') = 10, 20, 30, gamma 0.5: R2 = 1 + 0.5 * 30 = 16, R1 = 1 + 0.5 * 16 = 9, R0 = 5.5."""
    reward, next_v, zero = T(1, 1, 1), T(10, 20, 30), T(0, 0, 0)
    torch.testing.assert_close(calc_nstep_returns(reward, next_v, zero, zero, 0.5), T(5.5, 9, 16))
    # truncated at t=1: R1 = 1 + 0.5 * V(s'_1) = 11, R0 = 1 + 0.5 * 11 = 6.5
    torch.testing.assert_close(calc_nstep_returns(reward, next_v, zero, T(0, 1, 0), 0.5), T(6.5, 11, 16))
    # terminated at t=1: R1 = 1, R0 = 1.5
    torch.testing.assert_close(calc_nstep_returns(reward, next_v, T(0, 1, 0), T(0, 1, 0), 0.5), T(1.5, 1, 16))


def test_calc_nstep_returns_is_gae_lam_one_plus_value():
    g = torch.Generator().manual_seed(0)
    reward, value, next_v = (torch.rand(6, 2, generator=g, dtype=torch.float64) for _ in range(3))
    term = (torch.rand(6, 2, generator=g) < 0.2).double()
    done = torch.maximum(term, (torch.rand(6, 2, generator=g) < 0.2).double())
    value[1:] = torch.where(done[:-1].bool(), value[1:], next_v[:-1])  # V(s_{t+1}) = V(s'_t) within an episode
    gae = calc_gaes(reward, value, next_v, term, done, 0.9, 1.0)
    torch.testing.assert_close(calc_nstep_returns(reward, next_v, term, done, 0.9), gae + value)
