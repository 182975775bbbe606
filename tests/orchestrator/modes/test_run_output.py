"""What a run prints and leaves behind at its end: the summary of dev/train, the interrupt summary
and resume command, the resume header, dev runs refused by ``train@``, a resume with nothing to do,
per-trial analysis in a search, plain progress off a terminal, and CLI help/version/argument hints."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from lab_helpers import SPECS, files_digest, only_predir, overrides, run_cli

from orchestrator import cli
from orchestrator import commandline as commandline_mod
from orchestrator.errors import EXIT_RESUMABLE
from orchestrator.report.progress import SessionProgress
from orchestrator.session.events import Done
from orchestrator.spec.load import load_spec
from orchestrator.store.record import RunRecord, SessionPlan
from orchestrator.trial import Trial

DEMO = str(Path(SPECS).parents[1] / "demo.json")


# ---------------------------------------------------------------- printed commands

def test_entry_command_follows_argv0(tmp_path, monkeypatch):
    assert commandline_mod.entry_command("/home/u/.venv/bin/lab") == "lab"
    monkeypatch.chdir(tmp_path)
    assert commandline_mod.entry_command("run_lab.py") == f"python {tmp_path}/run_lab.py"
    assert commandline_mod.entry_command(str(Path(cli.__file__))) == "python -m orchestrator.cli"
    monkeypatch.setattr(sys, "argv", ["/usr/bin/lab"])
    assert commandline_mod.lab_command("specs/x.json", "ppo", "train@data/ppo_1") == \
        f"lab {tmp_path}/specs/x.json ppo train@{tmp_path}/data/ppo_1"
    assert commandline_mod.lab_command("s3://b/x.json", "ppo", "train@latest") == "lab s3://b/x.json ppo train@latest"


def test_interrupt_summary_names_committed_frames_and_sessions_not_started(tmp_path, monkeypatch, capsys):
    """Three sessions at a stop: one committed at 2400, one started without a checkpoint, one whose
    actor never began (no pid in run.json)."""
    monkeypatch.setattr(sys, "argv", ["/usr/bin/lab"])
    spec = load_spec(SPECS, "ppo_cartpole", ["meta.max_session=3", "meta.random_seed=1"])
    predir = str(tmp_path / "ppo_cartpole_2026_01_02_030405")
    record = RunRecord(predir, {"sessions": {}, "resumes": []})
    plans = [SessionPlan(0, s, s, resume=False) for s in range(3)]
    plans[0].status, plans[0].frame = "interrupted", 2400
    record.update(plans[0], checkpoint=2400)
    plans[1].status = plans[2].status = "running"
    record.update(plans[1])
    record.data["sessions"]["t0_s1"]["pid"] = 123
    record.update(plans[2])
    trial = Trial(spec, predir, plans, record, quiet=True, analyze=False)
    trial.stopping_since = 0.0
    assert trial.finish() == 75  # t0_s1 committed nothing within the grace period: resumable from its last one
    out = capsys.readouterr().out.splitlines()
    assert out == ["interrupted:",
                   "  t0_s0: interrupted, committed checkpoint at frame 2400",
                   "  t0_s1: interrupted, no committed checkpoint (no final checkpoint within shutdown_grace_s=30.0 s)",
                   "  t0_s2: not started",
                   "resume with:",
                   f"  lab {predir}/ppo_cartpole_spec.json ppo_cartpole train@{predir} --allow-fresh"]
    run = json.loads((Path(predir) / "run.json").read_text())
    assert [run["sessions"][f"t0_s{s}"]["status"] for s in range(3)] == ["interrupted", "interrupted",
                                                                        "not started"]
    assert run["sessions"]["t0_s2"]["error"] is None


def test_stop_while_a_session_waits_for_resources(ray_local, tmp_path, monkeypatch, capsys):
    """2 sessions of 3 CPUs on a 4-CPU Ray: one waits; a stop at the other's first log leaves the waiting one
    ``not started`` (its actor is never run) and the running one interrupted at a committed checkpoint. Ray
    usually places t0_s0 first; under load it may be t0_s1. The frame budget is far beyond what a session trains
    between its first log row and the stop reaching it (at a load of 4 on 2 cores a 4,000-frame budget was done
    first)."""
    from orchestrator.modes.train import plan_fresh

    monkeypatch.setattr(sys, "argv", ["/usr/bin/lab"])
    spec = load_spec(SPECS, "ppo_cartpole", ["meta.max_session=2", "env.max_frame=400000", "meta.log_frequency=400",
                                             "meta.random_seed=5", 'meta.resources={"num_cpus": 3, "num_gpus": 0}'])
    predir, plans = plan_fresh(spec, str(tmp_path / "data"))
    record = RunRecord.load_or_new(predir, spec["name"])
    trial = Trial(spec, predir, plans, record, quiet=True, analyze=False,
                  on_log=lambda plan, row: trial.request_stop())
    assert trial.run() == EXIT_RESUMABLE
    run = json.loads((Path(predir) / "run.json").read_text())
    first, waiting = (0, 1) if run["sessions"]["t0_s0"]["status"] == "interrupted" else (1, 0)
    s0, s1 = run["sessions"][f"t0_s{first}"], run["sessions"][f"t0_s{waiting}"]
    assert s0["status"] == "interrupted" and s0["checkpoint"] >= 400
    assert s1["status"] == "not started" and "pid" not in s1 and not (Path(predir) / f"t0/s{waiting}/ckpt").exists()
    out = capsys.readouterr().out.splitlines()
    assert out[out.index("interrupted:") + 1:] == sorted([
        f"  t0_s{first}: interrupted, committed checkpoint at frame {s0['checkpoint']}",
        f"  t0_s{waiting}: not started"]) + [
        "resume with:", f"  lab {predir}/ppo_cartpole_spec.json ppo_cartpole train@{predir} --allow-fresh"]


# ---------------------------------------------------------------- dev

def test_dev_writes_metrics_graphs_and_summary_and_cannot_be_resumed(tmp_path, capsys, monkeypatch):
    data = tmp_path / "data"
    assert run_cli(DEMO, "dqn_cartpole", "dev", "--data-dir", str(data),
                   *overrides(["env.max_frame=400", "meta.log_frequency=200", "meta.random_seed=3"])) == 0
    out = capsys.readouterr().out
    predir = only_predir(data)
    run = json.loads((predir / "run.json").read_text())
    assert run["mode"] == "dev" and run["resumes"] == []
    assert run["sessions"]["t0_s0"]["status"] == "done" and run["sessions"]["t0_s0"]["frame"] == 400
    df = pd.read_parquet(predir / "t0/s0/train_df.parquet")
    metrics = json.loads((predir / "t0/s0/session_metrics.json").read_text())
    final = df["total_reward_ma"].iloc[-1]
    assert metrics["total_reward_ma"] == pytest.approx(final) and metrics["frame"] == 400
    assert (f"  t0_s0: frame=400 total_reward_ma={final:.4g} strength={metrics['train']['strength']:.4g}"
            in out.splitlines())
    assert "  CartPole-v1: reward_threshold=475, random policy=" in out
    for name in ("dqn_cartpole_t0_s0_session_graph.png", "dqn_cartpole_t0_trial_graph.png"):
        assert (predir / "graph" / name).read_bytes()[:4] == b"\x89PNG"
        assert f"  graph: {predir / 'graph' / name}" in out.splitlines()

    assert run_cli("ls", "--data-dir", str(data)) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].endswith("resumable=no (dev run: no checkpoints)")
    assert listed[1].split()[:3] == ["t0_s0", "done", "400/400"]

    before = files_digest(predir)
    monkeypatch.setattr(sys, "argv", ["/usr/bin/lab"])
    assert run_cli(DEMO, "dqn_cartpole", f"train@{predir}", "--allow-fresh", "--data-dir", str(data),
                   *overrides(["env.max_frame=400", "meta.log_frequency=200", "meta.random_seed=3"])) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is a dev run" in err and "cannot be resumed" in err
    # the user's spec file and overrides, not the dev run's saved spec (meta.max_session rewritten to 1)
    assert err.rstrip().endswith(f"start a train run instead: lab {DEMO} dqn_cartpole train -s env.max_frame=400 "
                                 f"-s meta.log_frequency=200 -s meta.random_seed=3 --data-dir {data}")
    assert "Traceback" not in err
    assert files_digest(predir) == before, "a refused resume changed the dev run"


def test_readme_demo_reaches_the_reward_threshold(tmp_path, capsys):
    """README command 1 (its spec and name, the saved seed) ends at CartPole's 500, above the threshold 475,
    and shows the threshold in its summary (about 10 s on one core)."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    command = next(line for line in readme.splitlines() if "python run_lab.py" in line and line.startswith("pip"))
    spec_file, spec_name, mode = command.split("python run_lab.py ")[1].split()
    assert (spec_file, mode) == ("specs/demo.json", "dev")
    path = str(Path(__file__).resolve().parents[3] / spec_file)
    assert run_cli(path, spec_name, mode, "--data-dir", str(tmp_path)) == 0
    out = capsys.readouterr().out
    metrics = json.loads((only_predir(tmp_path) / "t0/s0/session_metrics.json").read_text())
    assert metrics["frame"] == 50000 and metrics["total_reward_ma"] == 500.0
    assert f"  t0_s0: frame=50000 total_reward_ma=500 strength={metrics['train']['strength']:.4g}" in out
    assert "  CartPole-v1: reward_threshold=475, random policy=" in out


# ---------------------------------------------------------------- train / train@

def test_train_summary_resume_header_and_nothing_to_resume(ray_local, tmp_path, capsys):
    data = str(tmp_path / "data")
    items = ["meta.max_session=2", "env.max_frame=800", "meta.log_frequency=400", "meta.random_seed=7"]
    assert run_cli(SPECS, "ppo_cartpole", "train", "--data-dir", data, *overrides(items)) == 0
    out = capsys.readouterr().out.splitlines()
    predir = only_predir(tmp_path / "data")
    assert f"trial done: {predir}" in out
    trial = json.loads((predir / "info/t0_trial_metrics.json").read_text())
    for s in (0, 1):
        final = pd.read_parquet(predir / f"t0/s{s}/train_df.parquet")["total_reward_ma"].iloc[-1]
        strength = json.loads((predir / f"t0/s{s}/session_metrics.json").read_text())["train"]["strength"]
        assert f"  t0_s{s}: frame=800 total_reward_ma={final:.4g} strength={strength:.4g}" in out
    assert trial["total_reward_ma"] == pytest.approx(
        sum(pd.read_parquet(predir / f"t0/s{s}/train_df.parquet")["total_reward_ma"].iloc[-1] for s in (0, 1)) / 2)
    assert (f"  t0 (mean of 2 session(s)): total_reward_ma={trial['total_reward_ma']:.4g} "
            f"strength={trial['strength']:.4g} consistency={trial['consistency']:.4g}") in out
    assert any(line.startswith("  CartPole-v1: reward_threshold=475, ") for line in out)
    assert f"  graph: {predir}/graph/ppo_cartpole_t0_trial_graph.png" in out

    assert run_cli(SPECS, "ppo_cartpole", "train@latest", "--data-dir", data, *overrides(items)) == 0
    assert "nothing to resume" in capsys.readouterr().out
    assert json.loads((predir / "run.json").read_text())["resumes"] == []

    more = [i.replace("max_session=2", "max_session=3") for i in items]
    assert run_cli(SPECS, "ppo_cartpole", f"train@{predir}", "--data-dir", data, *overrides(more)) == 0
    header = [line for line in capsys.readouterr().out.splitlines() if "sessions to resume" in line]
    assert header == [f"train@{predir} (1 of 3 sessions to resume, 2 done)"]  # the run dir once
    assert [r["from_frames"] for r in json.loads((predir / "run.json").read_text())["resumes"]] == [{"t0_s2": 0}]


def test_a_complete_named_run_again_names_its_max_frame_and_answers_before_ray(ray_local, tmp_path, capsys,
                                                                               monkeypatch):
    data = str(tmp_path / "data")
    items = ["meta.max_session=1", "env.max_frame=400", "meta.log_frequency=200", "meta.random_seed=7"]
    assert run_cli(SPECS, "ppo_cartpole", "train", "--name", "tour", "--data-dir", data, *overrides(items)) == 0
    predir = tmp_path / "data" / "tour"
    before = files_digest(predir)
    from orchestrator.modes import train as train_mod
    started = []
    monkeypatch.setattr(train_mod, "init_ray", lambda *args, **kwargs: started.append(args))
    capsys.readouterr()
    assert run_cli(SPECS, "ppo_cartpole", "train", "--name", "tour", "--data-dir", data) == 0  # no -s this time
    out = capsys.readouterr().out
    assert out == (f"train --name tour: the run {predir} is already complete at its max_frame 400 (the -s overrides "
                   f"it was started with apply again: -s {' -s '.join(items)}); nothing to do. To train it longer, "
                   "run the same command with -s env.max_frame=N (N > 400)\n"), out
    assert started == [] and files_digest(predir) == before
    # a longer max_frame is an edit: Ray starts and the run trains on
    monkeypatch.undo()
    assert run_cli(SPECS, "ppo_cartpole", "train", "--name", "tour", "--data-dir", data,
                   "-s", "env.max_frame=600") == 0
    assert pd.read_parquet(predir / "t0/s0/train_df.parquet")["frame"].tolist() == [200, 400, 600]


# ---------------------------------------------------------------- search: analysis when a trial ends

def test_search_trial_is_analyzed_by_the_driver_when_it_ends_and_search_at_leaves_it(ray_local, tmp_path,
                                                                                       monkeypatch):
    import threading

    import orchestrator.report.analysis as analysis

    calls = []  # (trials, thread) of every analyze_predir call of the search
    real = analysis.analyze_predir

    def recorded(predir, trials=None):
        calls.append((trials, threading.current_thread().name))
        return real(predir, trials=trials)

    monkeypatch.setattr(analysis, "analyze_predir", recorded)
    data = str(tmp_path / "data")
    items = ["meta.max_session=1", "env.max_frame=800", "meta.log_frequency=400", "meta.random_seed=11",
             'meta.resources={"num_cpus": 0.5, "num_gpus": 0}',
             'search={"agent.algorithm.gamma__grid_search": [0.9, 0.99]}']
    assert run_cli(SPECS, "ppo_cartpole", "search", "--data-dir", data, "--max-concurrent-trials", "1",
                   *overrides(items)) == 0
    predir = only_predir(tmp_path / "data")
    # each trial once, by the driver's analysis thread as it ended; the final analysis had none left to do
    assert sorted(calls) == [([0], "search-analysis"), ([1], "search-analysis")]

    def analysis_files(t):
        return [predir / f"t{t}/s0/session_metrics.json", predir / f"info/t{t}_trial_metrics.json",
                predir / f"graph/ppo_cartpole_t{t}_s0_session_graph.png",
                predir / f"graph/ppo_cartpole_t{t}_trial_graph.png"]

    stamps = {p: (p.stat().st_mtime_ns, p.read_bytes()) for t in (0, 1) for p in analysis_files(t)}
    calls.clear()
    assert run_cli(SPECS, "ppo_cartpole", "search@latest", "--data-dir", data, *overrides(items)) == 0
    assert calls == []
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in stamps} == stamps
    exp = pd.read_parquet(predir / "info/experiment_df.parquet")
    assert exp["strength"].notna().all() and len(exp) == 2


# ---------------------------------------------------------------- progress and CLI friction

def test_progress_off_a_terminal_prints_plain_lines_and_no_bars(capsys):
    with SessionProgress() as progress:
        assert progress.plain
        progress.update("t0_s0", {"frame": 100, "fps": 50.0, "total_reward_ma": 9.5}, 1000)
        progress.status("t0_s0", "done")
    assert capsys.readouterr().out.splitlines() == ["t0_s0 frame 100/1000 fps 50.0 total_reward_ma 9.5",
                                                    "t0_s0 frame 100/1000 fps 50.0 total_reward_ma 9.5 done"]


def test_a_session_ending_before_max_frame_is_paused_not_done(tmp_path, capsys):
    """A PBT generation's Trial runs its sessions to the generation's frame: off a terminal their line says
    ``paused`` there, and ``done`` only at the run's max_frame."""
    spec = load_spec(SPECS, "ppo_cartpole", ["meta.max_session=1", "env.max_frame=1200"])
    plan = SessionPlan(0, 0, 1, resume=False)
    predir = str(tmp_path / "ppo_cartpole_2026_01_02_030405")
    trial = Trial(spec, predir, [plan], RunRecord(predir, {"sessions": {}, "resumes": []}), quiet=True,
                  analyze=False)
    with SessionProgress() as trial.progress:
        for frame in (400, 1200):
            trial.progress.update("t0_s0", {"frame": frame, "fps": 50.0, "total_reward_ma": 9.5}, 1200, line=True)
            trial.on_end(plan, Done(frame=frame, checkpoint=True))
    assert capsys.readouterr().out.splitlines() == ["t0_s0 frame 400/1200 fps 50.0 total_reward_ma 9.5",
                                                    "t0_s0 frame 400/1200 fps 50.0 total_reward_ma 9.5 paused",
                                                    "t0_s0 frame 1200/1200 fps 50.0 total_reward_ma 9.5",
                                                    "t0_s0 frame 1200/1200 fps 50.0 total_reward_ma 9.5 done"]


def test_version_help_and_argument_order_hint(capsys):
    assert run_cli("--version") == 0
    assert capsys.readouterr().out.strip() == f"lab (rl-trial-lab) {cli.package_version()}"
    assert run_cli("--help") == 0
    out = capsys.readouterr().out
    assert "lab ls [--data-dir URI]" in out and "lab analyze PREDIR" in out and "train@latest" in out
    for command in ("ls", "analyze"):
        assert run_cli(command, "--help") == 0
        out = capsys.readouterr().out
        assert "``" not in out and "[bold]" not in out and f"usage: lab {command}" in out
    assert run_cli("train", SPECS, "ppo_cartpole") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 'train' is a mode, not a spec file")
    assert f"did you mean 'lab {SPECS} ppo_cartpole train'?" in err
    assert run_cli(SPECS, "train", "ppo_cartpole") == 2
    assert f"did you mean 'lab {SPECS} ppo_cartpole train'?" in capsys.readouterr().err
    # the overrides the user typed stay in the suggested command (without them it would be a full-length run)
    assert run_cli("train", SPECS, "ppo_cartpole", "-s", "env.max_frame=400",
                   "-s", 'meta.resources={"num_cpus": 1}') == 2
    assert (f"did you mean 'lab {SPECS} ppo_cartpole train -s env.max_frame=400 "
            """-s 'meta.resources={"num_cpus": 1}''?""") in capsys.readouterr().err


def test_mode_header_names_the_run_dir_once():
    assert commandline_mod.mode_header("train@/d/ppo_1", "/d/ppo_1") == "train@/d/ppo_1"
    assert commandline_mod.mode_header("train@ppo_1", "/d/ppo_1") == "train@/d/ppo_1"
    assert commandline_mod.mode_header("train@latest", "/d/ppo_1") == "train@latest: /d/ppo_1"
    assert commandline_mod.mode_header("search", "/d/ppo_1") == "search: /d/ppo_1"
