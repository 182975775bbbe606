"""Lean processes (docs/BENCHMARKS.md "Process memory"): what a session actor and a ``train`` driver import,
each checked in a fresh interpreter (``sys.modules`` after the work, not after the imports alone)."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.spec.load import load_spec

REPO = Path(__file__).resolve().parents[2]
SPECS = str(REPO / "specs/benchmark/cartpole.json")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled",
       "RAY_USAGE_STATS_ENABLED": "0"}
# loaded by none of a CartPole session's work: plotting, Tune, the DataFrame library, TorchArcNet's builder, Atari,
# EnvPool, torch's compiler stack (its optimizers' wrappers import it: agents/torch_optim.py),
# TensorBoard's S3/fsspec
# backends in a session actor (installed with the test extra; its writer writes locally: tracking.LEAN_PROCESS)
NOT_IN_SESSION = ("pandas", "matplotlib", "plotly", "ray.tune", "torcharc", "ale_py", "envpool", "torch._dynamo",
                  "boto3", "botocore", "fsspec")

SESSION_CHILD = """
import json, sys
from orchestrator.report import tracking
from orchestrator.session.runner import SessionRunner
tracking.LEAN_PROCESS["tensorboard"] = True  # as SessionActor.__init__ (the session actor's process)
spec, predir = json.loads(sys.argv[1]), sys.argv[2]
runner = SessionRunner(spec, predir, 0, 0, 1, resume=False)
events = [e.kind for e in runner.events()]
spec["env"]["max_frame"] += 256  # and a resume from its last checkpoint (optimizer state loaded, more steps)
resumed = SessionRunner(spec, predir, 0, 0, 1, resume=True)
resumed_events = [e.kind for e in resumed.events()]
modules = sorted(sys.modules)
# pandas, once imported (train_df), works with pyarrow as usual after storage.skip_pandas_probe
from orchestrator.store import storage
copy = storage.read_parquet(runner.session_dir + "/train_df.parquet")
same = copy.equals(resumed.session.train_df) and len(copy) == 3
print(json.dumps({"events": events, "frame": runner.session.clock.frame, "modules": modules, "same": same,
                  "resumed_events": resumed_events, "resumed_frame": resumed.session.clock.frame,
                  "restored_frame": resumed.restored_frame}))
"""

DRIVER_CHILD = """
import json, sys
from orchestrator import cli
from orchestrator.modes import train as train_mode
train_mode.init_ray = lambda *args, **kwargs: None  # no Ray here: the driver's own imports are the subject
train_mode.check_resources = lambda meta, together=False: None
def run(tr):
    print("RESULT " + json.dumps({"modules": sorted(sys.modules), "spec": tr.spec, "predir": tr.predir}))
    return 0
train_mode.Trial.run = run
sys.exit(cli.main(sys.argv[1:]))
"""


def child(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=300)


def test_cartpole_session_actor_loads_no_pandas_plotting_tune_torcharc_ale_or_dynamo(tmp_path):
    spec = load_spec(SPECS, "ppo_cartpole", ["env.max_frame=512", "meta.log_frequency=256"])
    out = child(SESSION_CHILD, json.dumps(spec), str(tmp_path / "ppo_cartpole_2026_01_01_000000"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["frame"] == 512 and result["events"][0] == "started" and result["events"][-1] == "done"
    assert "checkpoint" in result["events"]  # it committed checkpoints (Parquet of train_df included)
    assert result["same"]  # the exported train_df.parquet, read through pandas, equals the session's train_df
    assert result["restored_frame"] == 512 and result["resumed_frame"] == 768  # resumed: optimizer state loaded
    assert result["resumed_events"][-1] == "done"
    modules = set(result["modules"])
    assert {"torch", "gymnasium", "orchestrator.session.loop", "torch.utils.tensorboard"} <= modules  # it did import
    loaded = sorted(m for m in modules if any(m == bad or m.startswith(bad + ".") for bad in NOT_IN_SESSION))
    assert loaded == [], loaded


def test_train_driver_loads_no_torch_and_gets_the_checked_spec_from_the_check_process(tmp_path):
    data = tmp_path / "data"
    out = child(DRIVER_CHILD, SPECS, "ppo_cartpole", "train", "--quiet", "--data-dir", str(data),
                "-s", "env.max_frame=512", "-s", "meta.random_seed=5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    modules = set(result["modules"])
    assert {"ray", "orchestrator.trial", "orchestrator.modes.spec_check"} <= modules
    heavy = sorted(m for m in modules if m.split(".")[0] in ("torch", "gymnasium", "ale_py", "mujoco", "torcharc",
                                                             "pandas", "matplotlib"))
    assert heavy == [] and "orchestrator.spec.load" not in modules, heavy
    expected = json.loads(json.dumps(load_spec(SPECS, "ppo_cartpole", ["env.max_frame=512", "meta.random_seed=5"])))
    assert result["spec"] == expected  # defaults filled, as checked in-process
    saved = json.loads((Path(result["predir"]) / "ppo_cartpole_spec.json").read_text())
    assert saved == expected


def test_train_driver_bad_spec_from_the_check_process_exits_2_creating_nothing(tmp_path):
    data = tmp_path / "data"
    out = child(DRIVER_CHILD, SPECS, "ppo_cartpole", "train", "--quiet", "--data-dir", str(data),
                "-s", "agent.net.optim_spec={\"name\": \"Adam\", \"lrr\": 0.01}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr + out.stdout
    assert "agent.net.optim_spec" in out.stderr and "lrr" in out.stderr, out.stderr
    assert not data.exists()


def test_resume_driver_loads_no_torch_and_merges_the_spec_in_the_check_process(tmp_path):
    """``train@``: the given spec's check and its merge into the saved spec run in the check process too; an
    edit is applied, one that contradicts the past exits 2 naming the key and leaves every file of the run
    as it was."""
    data = tmp_path / "data"
    first = child(DRIVER_CHILD, SPECS, "ppo_cartpole", "train", "--quiet", "--data-dir", str(data),
                  "-s", "env.max_frame=512", "-s", "meta.random_seed=5", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    predir = Path(json.loads(next(x for x in first.stdout.splitlines()
                                  if x.startswith("RESULT "))[len("RESULT "):])["predir"])
    before = {p: p.read_bytes() for p in predir.rglob("*") if p.is_file()}
    bad = child(DRIVER_CHILD, SPECS, "ppo_cartpole", f"train@{predir}", "--quiet", "--data-dir", str(data),
                "-s", "env.max_frame=512", "-s", "agent.algorithm.gamma=0.5", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr, bad.stderr
    assert "agent.algorithm.gamma" in bad.stderr and "0.5" in bad.stderr
    assert {p: p.read_bytes() for p in predir.rglob("*") if p.is_file()} == before
    n = json.loads((predir / "ppo_cartpole_spec.json").read_text())["meta"]["max_session"]
    more = child(DRIVER_CHILD, SPECS, "ppo_cartpole", f"train@{predir}", "--quiet", "--data-dir", str(data),
                 "-s", "env.max_frame=512", "-s", "meta.random_seed=5", "-s", f"meta.max_session={n + 1}", cwd=tmp_path)
    assert more.returncode == 2, more.stderr  # the saved sessions lack checkpoints; the added one is new, not missing
    named = more.stderr.split("no committed checkpoint for session(s) ", 1)[1].split(";")[0]
    assert named == ", ".join(f"t0_s{s}" for s in range(n)), more.stderr
    assert {p: p.read_bytes() for p in predir.rglob("*") if p.is_file()} == before
    out = child(DRIVER_CHILD, SPECS, "ppo_cartpole", f"train@{predir}", "--quiet", "--allow-fresh", "--data-dir",
                str(data), "-s", "env.max_frame=1024", "-s", "meta.random_seed=5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "applied spec edit: env.max_frame: 512 -> 1024" in out.stdout
    result = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    modules = set(result["modules"])
    assert {"ray", "orchestrator.trial", "orchestrator.modes.spec_check"} <= modules
    heavy = sorted(m for m in modules if m.split(".")[0] in ("torch", "gymnasium", "ale_py", "mujoco", "torcharc",
                                                             "pandas", "matplotlib"))
    assert heavy == [] and "orchestrator.spec.load" not in modules, heavy
    assert result["predir"] == str(predir) and result["spec"]["env"]["max_frame"] == 1024
    assert json.loads((predir / "ppo_cartpole_spec.json").read_text())["env"]["max_frame"] == 1024


def test_a_session_actor_keeps_pydantic_out_of_rays_serializer_and_still_builds_a_torcharc_net(ray_local, tmp_path):
    """Ray's serialization context imports pydantic (installed: torcharc's dependency) in every worker at its first
    deserialization; a ``SessionActor`` is built with no arguments and its ``__init__`` hides pydantic from that one
    import (``skip_ray_pydantic_serializers``), so after it has deserialized a spec its process maps no
    ``pydantic_core``. pydantic still imports as usual afterwards: a TorchArcNet session (torcharc needs it) runs."""
    import importlib.util

    import ray

    from orchestrator.session_actor import SessionActor
    from orchestrator.spec.load import check

    assert importlib.util.find_spec("pydantic") is not None  # else Ray could not import it anyway
    spec = load_spec(SPECS, "ppo_cartpole", ["env.max_frame=256", "meta.log_frequency=128", "meta.tensorboard=false"])
    arc_spec = copy.deepcopy(spec)
    arc_spec["agent"]["net"].update(type="TorchArcNet", arc={
        "modules": {"body": {"Sequential": [{"LazyLinear": {"out_features": 16}}, {"Tanh": None}]}},
        "graph": {"input": "x", "modules": {"body": ["x"]}, "output": "body"}})
    # a runtime_env of its own: a fresh worker process, never one that ran other tests' tasks
    actor = SessionActor.options(num_cpus=0.5, runtime_env={"env_vars": {"RL_TRIAL_LAB_TEST_WORKER": "fresh"}}).remote()
    try:
        pid = ray.get(actor.pid.remote())
        assert ray.get(actor.check_spec.remote(spec)) == spec  # a spec deserialized in the actor's process
        assert "pydantic_core" not in Path(f"/proc/{pid}/maps").read_text()
        session = {"spec": check(arc_spec), "predir": str(tmp_path / "ppo_cartpole_2026_01_01_000000"), "trial": 0,
                   "session": 0, "seed": 1, "resume": False, "num_threads": 1}
        events = [ray.get(ref) for ref in actor.run.remote(session)]
        assert events[0].kind == "started" and events[-1].kind == "done" and events[-1].frame == 256
        assert "pydantic_core" in Path(f"/proc/{pid}/maps").read_text()  # torcharc imported it for real
    finally:
        ray.kill(actor)
