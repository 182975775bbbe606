"""SLM-Lab v4's optimizers: RAdam (torch's) and the Lookahead wrapper (Zhang et al. 2019) against a hand
computation, its checkpoint round trip, and its spec errors."""

import copy

import pytest
import torch

from agents.lookahead import Lookahead
from agents.nets import make_optim
from agents.schedules import make_lr_scheduler


def quadratic_step(optim, p):
    """One step on loss 0.5 * sum(p^2) (gradient p)."""
    optim.zero_grad()
    (0.5 * (p ** 2).sum()).backward()
    optim.step()


def test_radam_builds_as_torch_radam_and_steps_the_same():
    """``RAdam`` is torch.optim.RAdam with the spec's keys; three steps give torch's own values."""
    p, q = (torch.nn.Parameter(torch.tensor([1.0, -2.0])) for _ in range(2))
    optim = make_optim([p], {"name": "RAdam", "lr": 0.01, "betas": [0.9, 0.99]})
    ref = torch.optim.RAdam([q], lr=0.01, betas=(0.9, 0.99))
    assert type(optim) is torch.optim.RAdam and optim.defaults["lr"] == 0.01 and optim.defaults["betas"] == [0.9, 0.99]
    for _ in range(3):
        quadratic_step(optim, p)
        quadratic_step(ref, q)
    assert torch.equal(p, q) and not torch.equal(p.detach(), torch.tensor([1.0, -2.0]))


def test_lookahead_matches_the_paper_update_by_hand():
    """Inner SGD lr 0.1 on 0.5 p^2 (p <- 0.9 p), k = 2, alpha = 0.5, p0 = 1:
    steps 1, 2: 0.9, 0.81 -> slow 1 + 0.5 (0.81 - 1) = 0.905, p reset to 0.905;
    steps 3, 4: 0.8145, 0.73305 -> slow 0.905 + 0.5 (0.73305 - 0.905) = 0.819025; step 5: 0.7371225."""
    p = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    optim = make_optim([p], {"name": "Lookahead", "optimizer": "SGD", "lr": 0.1, "alpha": 0.5, "k": 2})
    assert isinstance(optim, Lookahead) and type(optim.inner) is torch.optim.SGD
    expected = [0.9, 0.905, 0.8145, 0.819025, 0.7371225]
    for want in expected:
        quadratic_step(optim, p)
        assert p.item() == pytest.approx(want, abs=1e-12)
    assert optim.slow[0].item() == pytest.approx(0.819025, abs=1e-12) and optim.step_count == 5


def test_lookahead_defaults_are_slm_lab_v4s_and_the_lr_schedule_reaches_the_inner_optimizer():
    """Default inner RAdam, alpha 0.5, k 5 (SLM-Lab v4's); an lr scheduler on the wrapper sets the inner lr."""
    p = torch.nn.Parameter(torch.zeros(2))
    optim = make_optim([p], {"name": "Lookahead", "lr": 0.002})
    assert type(optim.inner) is torch.optim.RAdam and (optim.alpha, optim.k) == (0.5, 5)
    sched = make_lr_scheduler(optim, {"name": "LinearToZero", "frame": 100})
    sched.step_to(25)
    assert optim.inner.param_groups[0]["lr"] == pytest.approx(0.0015)


def test_lookahead_state_round_trip_resumes_exactly():
    """Stopped after 7 steps (between synchronizations, k = 3) and restored into a fresh optimizer: the next 5
    steps give bit-identical weights, as the uninterrupted run."""
    spec = {"name": "Lookahead", "optimizer": "Adam", "lr": 0.05, "alpha": 0.6, "k": 3}
    torch.manual_seed(0)
    init = torch.randn(5)
    p = torch.nn.Parameter(init.clone())
    straight = make_optim([p], spec)
    for _ in range(7):
        quadratic_step(straight, p)
    saved = copy.deepcopy({"param": p.detach(), "optim": straight.state_dict()})  # as a checkpoint's bytes
    for _ in range(5):
        quadratic_step(straight, p)

    q = torch.nn.Parameter(torch.randn(5))
    resumed = make_optim([q], spec)
    with torch.no_grad():
        q.copy_(saved["param"])
    resumed.load_state_dict(saved["optim"])
    assert resumed.param_groups is resumed.inner.param_groups  # torch's load_state_dict builds a new list
    assert resumed.step_count == 7 and torch.equal(resumed.slow[0], straight_slow_after(init, spec, 7))
    for _ in range(5):
        quadratic_step(resumed, q)
    assert torch.equal(p, q)
    twin = copy.deepcopy(resumed)  # a copy keeps the inner optimizer, slow weights and count
    assert twin.step_count == 12 and torch.equal(twin.slow[0], resumed.slow[0]) and twin.param_groups[0]["lr"] == 0.05


def straight_slow_after(init, spec, steps):
    """The slow weights of a fresh run from ``init`` after ``steps`` steps."""
    p = torch.nn.Parameter(init.clone())
    optim = make_optim([p], spec)
    for _ in range(steps):
        quadratic_step(optim, p)
    return optim.slow[0]


@pytest.mark.parametrize("spec, message", [
    ({"alpha": 1.5}, "alpha must be a number in [0, 1], got 1.5"),
    ({"k": 0}, "k must be an int >= 1, got 0"),
    ({"optimizer": "Nadam"}, "unknown inner optimizer 'Nadam'"),
    ({"optimizer": "Lookahead"}, "unknown inner optimizer 'Lookahead'"),
])
def test_lookahead_bad_arguments_name_the_key(spec, message):
    with pytest.raises(ValueError, match="Lookahead") as err:
        make_optim([torch.nn.Parameter(torch.zeros(1))], {"name": "Lookahead", **spec})
    assert message in str(err.value)
