"""Bad input: every case exits 2 with one clear message (no traceback) and leaves an existing run
directory byte-identical."""

import shutil

import pytest
from lab_helpers import SPECS, files_digest, only_predir, overrides, run_cli

ITEMS = ["meta.max_session=2", "meta.log_frequency=400", "meta.random_seed=3", "env.max_frame=800"]
LONGER = ITEMS[:-1] + ["env.max_frame=1600"]


@pytest.fixture(scope="module")
def existing_run(ray_local, tmp_path_factory):
    """A finished 2-session run whose session 1 lost its checkpoints (for the --allow-fresh case)."""
    root = tmp_path_factory.mktemp("bad_input")
    data = root / "data"
    assert run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", str(data), *overrides(ITEMS)) == 0
    predir = only_predir(data)
    shutil.rmtree(predir / "t0/s1/ckpt")
    return root, data, predir


def write(root, name, text):
    path = root / name
    path.write_text(text)
    return str(path)


CASES = [
    # (id, argv builder, expected fragments of the message)
    ("spec file missing", lambda r, d, p: ["nope.json", "x", "train"], ["nope.json", "does not exist"]),
    ("not JSON", lambda r, d, p: [write(r, "bad.json", "{oops"), "x", "train"], ["not valid JSON", "line 1"]),
    ("YAML error", lambda r, d, p: [write(r, "bad.yaml", "a:\n  b: [1, 2\nc: 3\n"), "x", "train"],
     ["not valid YAML", "line"]),
    ("spec name not in file", lambda r, d, p: [SPECS, "ppo_cartpol", "train"],
     ["'ppo_cartpol' is not in", "ppo_cartpole", "dqn_cartpole"]),
    ("unknown key", lambda r, d, p: [SPECS, "ppo_cartpole", "train", "-s", "agent.net.hid_layer=[8]"],
     ["agent.net.hid_layer", "did you mean 'hid_layers'"]),
    ("wrong type", lambda r, d, p: [SPECS, "ppo_cartpole", "train", "-s", "meta.max_session=two"],
     ["meta.max_session", "expected int"]),
    ("out of range", lambda r, d, p: [SPECS, "ppo_cartpole", "train", "-s", "agent.algorithm.gamma=1.5"],
     ["agent.algorithm.gamma", "<= 1"]),
    ("train@ missing predir", lambda r, d, p: [SPECS, "ppo_cartpole", f"train@{d}/ppo_cartpole_2020_01_01_000000"],
     ["does not exist"]),
    ("train@ run of another spec", lambda r, d, p: [SPECS, "dqn_cartpole", f"train@{p}"],
     ["is a run of 'ppo_cartpole'", "not of 'dqn_cartpole'"]),
    ("train@ session without checkpoint", lambda r, d, p: [SPECS, "ppo_cartpole", f"train@{p}",
                                                            *overrides(LONGER)],
     ["no committed checkpoint", "t0_s1", "--allow-fresh"]),
    ("data dir not writable", lambda r, d, p: [SPECS, "ppo_cartpole", "train", "--data-dir",
                                               f"{p}/run.json/sub"], ["cannot"]),
    ("resources never fit", lambda r, d, p: [SPECS, "ppo_cartpole", "train", "--data-dir", str(d),
                                             "-s", "meta.resources={\"num_cpus\": 64}"],
     ["num_cpus=64", "can never fit"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_and_changes_nothing(existing_run, case, capsys):
    root, data, predir = existing_run
    _, argv, fragments = case
    before = files_digest(data)
    capsys.readouterr()
    code = run_cli(*argv(root, data, predir))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.startswith("error:")
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert files_digest(data) == before


def test_s3_bucket_that_does_not_exist_fails_fast(existing_run, s3_server, capsys):
    import time
    start = time.time()
    code = run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", "s3://no-such-bucket-lab/runs")
    assert code == 2 and time.time() - start < 30
    err = capsys.readouterr().err
    assert "no-such-bucket-lab" in err and "Traceback" not in err


def test_allow_fresh_starts_the_session_without_checkpoint(existing_run):
    root, data, predir = existing_run
    copy = data.parent / "copy" / predir.name
    shutil.copytree(predir, copy)
    assert run_cli(SPECS, "ppo_cartpole", f"train@{copy}", "--allow-fresh",
                   *overrides(LONGER)) == 0
    import pandas as pd
    for s in (0, 1):
        assert pd.read_parquet(copy / f"t0/s{s}/train_df.parquet")["frame"].tolist() == [400, 800, 1200, 1600]
