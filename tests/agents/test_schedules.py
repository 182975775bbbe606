"""Schedules are pure functions of the frame: values at exact frames, computed by hand."""

import math

import pytest
import torch

from agents.schedules import (
    DECAYS,
    FrameLR,
    VarSchedule,
    linear_decay,
    make_lr_scheduler,
    no_decay,
    periodic_decay,
    rate_decay,
)

# ---------------------------------------------------------------- decay functions

def test_no_decay_is_start_val_everywhere():
    assert [no_decay(0.3, 0.0, 0, 100, f) for f in (0, 50, 100, 10**9)] == [0.3] * 4


@pytest.mark.parametrize("frame, expected", [
    (0, 1.0), (100, 1.0),            # before and at start_step: start_val
    (350, 0.775),                    # 1 + (0.1 - 1) * 250 / 1000
    (600, 0.55),                     # halfway
    (1100, 0.1), (5000, 0.1),        # at and after end_step: end_val
])
def test_linear_decay_at_exact_frames(frame, expected):
    assert linear_decay(1.0, 0.1, 100, 1100, frame) == pytest.approx(expected, abs=1e-12)


def test_linear_decay_can_increase_and_rejects_reversed_steps():
    assert linear_decay(0.0, 2.0, 0, 10, 5) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="end_step=5 is before start_step=10"):
        linear_decay(1.0, 0.0, 10, 5, 7)


@pytest.mark.parametrize("frame, expected", [
    (0, 1.0),
    (49, 1.0),                # (1000 - 0) / 20 = 50 frames per decay: no decay yet
    (50, 0.9),
    (175, 0.9 ** 3),          # 175 // 50 = 3
    (999, 0.9 ** 19),         # 0.135 > end_val 0.1
    (1000, 0.1), (2000, 0.1),
])
def test_rate_decay_at_exact_frames(frame, expected):
    assert rate_decay(1.0, 0.1, 0, 1000, frame, decay_rate=0.9, frequency=20) == pytest.approx(expected)


def test_rate_decay_is_floored_at_end_val():
    # 0.9 ** 19 = 0.135 < end_val 0.3
    assert rate_decay(1.0, 0.3, 0, 1000, 999, decay_rate=0.9, frequency=20) == pytest.approx(0.3)


@pytest.mark.parametrize("frame, expected", [
    (0, 2.0),
    (125, 1.4375),   # x = 1/8: cos(pi/2) = 0 -> unit 0.5 * (1 - 1/8) = 0.4375
    (250, 1.0),      # x = 1/4: cos(pi) = -1 -> unit 0 -> end_val
    (500, 1.5),      # x = 1/2: cos(2 pi) = 1 -> unit (1 - 1/2) = 0.5
    (1000, 1.0), (1500, 1.0),
])
def test_periodic_decay_at_exact_frames(frame, expected):
    assert periodic_decay(2.0, 1.0, 0, 1000, frame, frequency=4) == pytest.approx(expected, abs=1e-12)


# ---------------------------------------------------------------- VarSchedule

def test_var_schedule_from_spec_values():
    sched = VarSchedule.from_spec({"name": "linear_decay", "start_val": 1.0, "end_val": 0.02,
                                   "start_step": 0, "end_step": 10000})
    assert sched(0) == 1.0
    assert sched(5000) == pytest.approx(0.51)
    assert sched(10000) == pytest.approx(0.02)
    assert sched.final_val == pytest.approx(0.02)


def test_var_schedule_none_is_constant_default():
    sched = VarSchedule.from_spec(None, default=0.2)
    assert (sched(0), sched(10**7), sched.final_val) == (0.2, 0.2, 0.2)
    assert math.isnan(VarSchedule.from_spec(None, default=math.nan)(5))


def test_var_schedule_no_decay_keeps_start_val_and_end_val_defaults_to_start():
    assert VarSchedule.from_spec({"name": "no_decay", "start_val": 0.01}).final_val == 0.01
    sched = VarSchedule.from_spec({"name": "linear_decay", "start_val": 0.5, "start_step": 0, "end_step": 10})
    assert sched.end_val == 0.5 and sched(5) == 0.5


def test_var_schedule_from_spec_errors():
    with pytest.raises(ValueError, match="unknown schedule 'cosine'") as err:
        VarSchedule.from_spec({"name": "cosine", "start_val": 1.0})
    for name in DECAYS:  # lists the valid names
        assert name in str(err.value)
    with pytest.raises(ValueError, match="end_step=10 is before start_step=20"):
        VarSchedule.from_spec({"name": "linear_decay", "start_val": 1.0, "end_val": 0.0,
                               "start_step": 20, "end_step": 10})


# ---------------------------------------------------------------- frame-driven LR

def make_optim(lr=0.01):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def lr_at(sched: FrameLR, frame: int) -> float:
    sched.step_to(frame)
    return sched.optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize("spec, frames_lrs", [
    ({"name": "LinearToZero", "frame": 1000},
     [(0, 0.01), (250, 0.0075), (500, 0.005), (1000, 0.0), (3000, 0.0)]),
    # LinearToMin: max(m, 1 - frame (1 - m) / frame_total); 250: 1 - 0.225 = 0.775; 500: 0.55; floor m = 0.1 after
    ({"name": "LinearToMin", "frame": 1000, "min_factor": 0.1},
     [(0, 0.01), (250, 0.00775), (500, 0.0055), (1000, 0.001), (3000, 0.001)]),
    # SLM-Lab's ppo_playground values: m = 0.033 at 600 frames; 300: 1 - 300 * 0.967 / 600 = 0.5165
    ({"name": "LinearToMin", "frame": 600, "min_factor": 0.033}, [(300, 0.005165), (600, 0.00033), (900, 0.00033)]),
    ({"name": "LinearToMin", "frame": 1000}, [(500, 0.0055), (2000, 0.001)]),  # min_factor default 0.1
    ({"name": "StepLR", "step_size": 100, "gamma": 0.5},
     [(0, 0.01), (99, 0.01), (100, 0.005), (250, 0.0025)]),
    ({"name": "MultiStepLR", "milestones": [100, 300], "gamma": 0.1},
     [(0, 0.01), (99, 0.01), (100, 0.001), (299, 0.001), (300, 0.0001), (10**6, 0.0001)]),
    ({"name": "CosineAnnealingLR", "T_max": 100}, [(0, 0.01), (50, 0.005), (100, 0.0), (200, 0.0)]),
    (None, [(0, 0.01), (10**6, 0.01)]),
])
def test_lr_scheduler_gives_base_lr_times_factor(spec, frames_lrs):
    sched = make_lr_scheduler(make_optim(0.01), spec)
    assert sched.optimizer.param_groups[0]["lr"] == pytest.approx(0.01)  # factor(0) == 1 for all
    for frame, lr in frames_lrs:
        assert lr_at(sched, frame) == pytest.approx(lr, abs=1e-12), (spec, frame)
    assert sched.get_last_lr() == [pytest.approx(frames_lrs[-1][1], abs=1e-12)]


def test_lr_scheduler_is_pure_in_frame_not_call_count():
    sched = make_lr_scheduler(make_optim(0.01), {"name": "LinearToZero", "frame": 1000})
    for frame in (900, 100, 100, 500):  # order and repeats do not matter
        lr_at(sched, frame)
    assert lr_at(sched, 500) == pytest.approx(0.005)


def test_lr_scheduler_state_dict_round_trip(tmp_path):
    spec = {"name": "StepLR", "step_size": 100, "gamma": 0.5}
    sched = make_lr_scheduler(make_optim(0.01), spec)
    lr_at(sched, 250)
    state = sched.state_dict()
    assert state == {"last_epoch": 250, "base_lrs": [0.01]}
    torch.save(state, tmp_path / "sched.pt")
    loaded = torch.load(tmp_path / "sched.pt", weights_only=True)

    fresh = make_lr_scheduler(make_optim(0.01), spec)
    fresh.load_state_dict(loaded)
    assert fresh.last_epoch == 250
    assert fresh.optimizer.param_groups[0]["lr"] == pytest.approx(0.0025)
    assert lr_at(fresh, 300) == pytest.approx(0.00125) == lr_at(sched, 300)


def test_lr_scheduler_errors():
    with pytest.raises(ValueError, match="unknown lr_scheduler 'Exp'.*LinearToZero"):
        make_lr_scheduler(make_optim(), {"name": "Exp"})
    with pytest.raises(ValueError, match="bad arguments for lr_scheduler 'StepLR'"):
        make_lr_scheduler(make_optim(), {"name": "StepLR", "steps": 10})
    with pytest.raises(ValueError, match=r"min_factor must be in \[0, 1\], got 1.5"):
        make_lr_scheduler(make_optim(), {"name": "LinearToMin", "frame": 10, "min_factor": 1.5})
    with pytest.raises(ValueError, match="frame must be > 0, got 0"):
        make_lr_scheduler(make_optim(), {"name": "LinearToMin", "frame": 0})
