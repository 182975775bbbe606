"""``bench/replay_memory.py`` (docs/BENCHMARKS.md "Replay memory per 1M Atari transitions"): a short Pong stream
gives each replay kind's exact bytes per transition, and the command line writes its JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import replay_memory  # noqa: E402

OBS = 4 * 84 * 84  # bytes of one (4, 84, 84) uint8 observation


def test_bytes_per_transition_on_a_pong_stream():
    rec = replay_memory.measure(transitions=65, num_envs=2, seed=3)  # 32 vector steps: 64 transitions
    assert rec["obs_shape"] == [4, 84, 84] and rec["obs_dtype"] == "uint8" and rec["transitions"] == 64
    assert rec["episode_ends"] == 0  # a Pong episode lasts far longer than 32 steps
    kinds = {k: v["bytes_per_transition"] for k, v in rec["kinds"].items()}
    # beside the observations: act int64 (8 bytes), reward and terminated float32 (4 each): 16 bytes
    assert kinds["Replay (float32)"] == 2 * 4 * OBS + 16
    assert kinds["Replay (uint8)"] == 2 * OBS + 16
    # each observation once, plus the newest step's 2 next observations (no episode ended: no final ones)
    assert kinds["FrameOnceReplay (uint8)"] == OBS + 16 + 2 * OBS / 64
    # each frame once + a head flag, plus the first step's 2 heads (3 older frames each) and the 2 next observations
    assert kinds["FrameStackReplay (uint8)"] == OBS / 4 + 17 + (2 * 3 * OBS / 4 + 2 * OBS) / 64
    assert kinds["PrioritizedFrameStackReplay (uint8)"] == kinds["FrameStackReplay (uint8)"] + 2 * 64 * 8 / 64  # tree
    assert rec["kinds"]["Replay (uint8)"]["gb_per_1m"] == (2 * OBS + 16) * 1e6 / 1e9


def test_command_line_writes_json(tmp_path):
    out = tmp_path / "replay_memory.json"
    assert replay_memory.main(["--transitions", "8", "--envs", "2", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["goal_gb_per_1m"] == 7.2 and set(rec["kinds"]) == {"Replay (float32)", "Replay (uint8)",
                                                                  "FrameOnceReplay (uint8)",
                                                                  "FrameStackReplay (uint8)",
                                                                  "PrioritizedFrameStackReplay (uint8)"}


def test_too_few_transitions_is_a_clear_error(capsys):
    try:
        replay_memory.main(["--transitions", "3", "--envs", "2", "--out", "unused.json"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("expected exit 2")
    assert "--transitions >= 2 * --envs, got 2 and 3" in capsys.readouterr().err
