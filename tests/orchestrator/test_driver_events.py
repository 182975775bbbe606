"""The driver's event handling at scale: checkpoint batches, the batched watch loop, held run.json writes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lab_helpers import SPECS

from orchestrator.session import events as ev
from orchestrator.session.runner import SessionRunner, checkpoint_batches
from orchestrator.spec.load import load_spec
from orchestrator.store import storage
from orchestrator.store.record import RunRecord, SessionPlan
from orchestrator.trial import Trial

REPO = Path(__file__).resolve().parents[2]
RAISE = "raise"  # in a fake stream's events: its code raises there


def test_checkpoint_batches_group_a_checkpoints_commit_and_its_rows(tmp_path):
    """4 log rows per checkpoint: each checkpoint's events reach the driver as one object, in events()'s order."""
    spec = load_spec(SPECS, "ppo_cartpole", ["env.max_frame=1024", "meta.log_frequency=128",
                                             "meta.checkpoint_frequency=512", "meta.random_seed=3",
                                             "meta.tensorboard=false"])
    runner = SessionRunner(spec, str(tmp_path / "ppo_cartpole_2026_01_01_000000"), 0, 0, 3, resume=False)
    out = list(checkpoint_batches(runner))
    shape = [[(e.kind, e.row["frame"] if isinstance(e, ev.Log) else getattr(e, "frame", None)) for e in x.events]
             if x.kind == "batch" else (x.kind, getattr(x, "frame", None)) for x in out]
    rows = [("log", f) for f in (128, 256, 384, 512)]
    assert shape == [("started", None), rows,  # frame 512: no earlier write to report, the chunk's 4 rows
                     [("checkpoint", 512), *[("log", f + 512) for _, f in rows]],  # 512 committed, rows to 1024
                     ("checkpoint", 1024), ("done", 1024)]


def test_trial_handles_a_batch_as_its_events_one_by_one(tmp_path):
    spec = load_spec(SPECS, "ppo_cartpole", ["meta.max_session=1", "meta.random_seed=1"])
    events = [ev.Checkpoint(frame=800, seconds=0.01),
              *(ev.Log({"frame": f, "fps": 1.0, "total_reward_ma": 9.0}) for f in (1000, 1200))]
    results = []
    for stream in (events, [ev.Batch(events)]):
        plan = SessionPlan(0, 0, 1, False, status="running")
        record = RunRecord(str(tmp_path), {"sessions": {}, "resumes": []})
        logged = []
        trial = Trial(spec, str(tmp_path), [plan], record, quiet=True,
                      on_log=lambda p, row: logged.append(row["frame"]))
        for event in stream:
            trial.handle(plan, event)
        results.append((plan.frame, record.data["sessions"]["t0_s0"]["checkpoint"], logged))
    assert results[0] == results[1] == (1200, 800, [1000, 1200])


def test_trial_starts_the_analysis_preload_once_at_its_first_log_row(tmp_path, monkeypatch):
    import orchestrator.trial as trial_mod

    started = []
    monkeypatch.setattr(trial_mod, "preload_analysis", lambda: started.append(len(started)) or f"thread{len(started)}")
    spec = load_spec(SPECS, "ppo_cartpole", ["meta.max_session=1", "meta.random_seed=1"])
    plan = SessionPlan(0, 0, 1, False, status="running")
    trial = Trial(spec, str(tmp_path), [plan], RunRecord(str(tmp_path), {"sessions": {}, "resumes": []}), quiet=True)
    trial.handle(plan, ev.Checkpoint(frame=800, seconds=0.01))
    assert started == [] and trial.preload is None  # not while the actors start
    for f in (1000, 1200):
        trial.handle(plan, ev.Log({"frame": f, "fps": 1.0, "total_reward_ma": 9.0}))
    assert started == [0] and trial.preload == "thread1"  # once, at the first row
    search_trial = Trial(spec, str(tmp_path), [plan], RunRecord(str(tmp_path), {"sessions": {}, "resumes": []}),
                         quiet=True, analyze=False)  # a search's trial: the driver analyzes it
    search_trial.handle(plan, ev.Log({"frame": 1400, "fps": 1.0, "total_reward_ma": 9.0}))
    assert started == [0] and search_trial.preload is None


def test_status_writes_are_held_for_a_batch_then_written_once(tmp_path, monkeypatch):
    writes = []
    monkeypatch.setattr(storage, "write_text", lambda uri, text: writes.append(json.loads(text)))
    record = RunRecord(str(tmp_path), {"sessions": {}})
    plans = [SessionPlan(0, s, s, False, status="running") for s in range(3)]
    record.hold = True
    for plan in plans:
        record.update(plan)
        record.update(plan, checkpoint=1, defer=True)  # a checkpoint after a held status change waits too
    assert writes == []
    record.hold = False
    record.flush_due()
    assert len(writes) == 1 and set(writes[0]["sessions"]) == {"t0_s0", "t0_s1", "t0_s2"}
    record.flush_due()  # nothing pending
    plans[0].status = "done"
    record.update(plans[0])  # not held: at once
    assert len(writes) == 2 and writes[1]["sessions"]["t0_s0"]["status"] == "done"


def test_run_json_text_is_json_with_one_line_per_session():
    data = {"spec_name": "x", "versions": {"ray": "2"}, "resumes": [{"at": "t", "from_frames": {"t0_s0": 5}}],
            "empty": {}, "sessions": {f"t0_s{s}": {"status": "running", "frame": s, "restarts": []} for s in range(5)}}
    text = RunRecord.dumps(data)
    assert json.loads(text) == data
    lines = text.splitlines()
    assert sum(line.lstrip().startswith('"t0_s') for line in lines) == 5 and len(lines) == 17


@pytest.fixture
def streams(ray_local):
    """A remote generator standing in for ``SessionActor.run``: yields ``events`` (``RAISE`` marks an error)."""
    @ray_local.remote(num_cpus=0)
    def stream(events):
        for event in events:
            if event == RAISE:
                raise ValueError("injected session bug")
            yield event
    return stream


def test_watch_takes_every_ready_event_of_many_streams_in_order(streams, tmp_path):
    """8 streams of 12 events each (single and batched) and one whose code raises: every event is handled
    in its stream's order, the finished streams are released, the raising one is failed."""
    spec = load_spec(SPECS, "ppo_cartpole", ["meta.max_session=9", "meta.random_seed=1"])
    plans = [SessionPlan(0, s, s, False) for s in range(9)]
    record = RunRecord(str(tmp_path), {"sessions": {}, "resumes": []})

    def events_of(s):
        if s == 8:
            return [ev.Log({"frame": 1}), RAISE]
        rows = [ev.Log({"frame": f}) for f in range(1, 11)]
        return [rows[0], ev.Batch(rows[1:6]), *rows[6:],
                ev.Checkpoint(frame=10, seconds=0.0), ev.Done(frame=10, checkpoint=True)]

    class Handle:
        def __init__(self, s):
            self.run = type("M", (), {"remote": staticmethod(lambda session: streams.remote(events_of(s)))})

    seen = {p.key: [] for p in plans}

    class FakeTrial(Trial):
        def new_actor(self, plan):
            return Handle(plan.session)

        def end_actor(self, actor):
            pass

        def handle(self, plan, event):
            if event.kind == "log":
                seen[plan.key].append(event.row["frame"])
            super().handle(plan, event)

        def log_error(self, plan, text):
            seen[plan.key].append("error")

    trial = FakeTrial(spec, str(tmp_path), plans, record, quiet=True, analyze=False)
    assert trial.run() == 1  # one session failed
    assert {k: v for k, v in seen.items() if k != "t0_s8"} == {f"t0_s{s}": list(range(1, 11)) for s in range(8)}
    assert seen["t0_s8"] == [1, "error"]
    assert [p.status for p in plans] == ["done"] * 8 + ["failed"] and trial.streams == {}
    assert "injected session bug" in plans[8].error
    assert json.loads((tmp_path / "run.json").read_text())["sessions"]["t0_s3"]["checkpoint"] == 10


def test_lean_head_params_drop_the_monitors_only_while_a_local_ray_starts():
    import ray._private.parameter as parameter

    from orchestrator.runtime.ray_params import lean_head_params

    base = parameter.RayParams
    with lean_head_params():
        lean, explicit = parameter.RayParams(), parameter.RayParams(include_log_monitor=True)
    assert (lean.no_monitor, lean.include_log_monitor) == (True, False)
    assert explicit.include_log_monitor is True  # what the caller sets wins
    assert parameter.RayParams is base and base().no_monitor is False


LOCAL_RAY_CHILD = """
import json, os, subprocess, sys, ray
import ray._private.node as node
from ray._private import ray_constants
from orchestrator.runtime.ray_start import init_ray
base, base_get_node = node.Node.start_api_server, ray._private.services.get_node
tables = []  # node tables the start's registration poll read (the last one has this node)
node_table = ray._private.state.GlobalState.node_table
ray._private.state.GlobalState.node_table = lambda self: tables.append(node_table(self)) or tables[-1]
init_ray(None)
ray._private.state.GlobalState.node_table = node_table
ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout  # -ww: whole lines
agent = [line for line in ps.splitlines()
         if "dashboard/agent.py" in line and ray._private.worker._global_node.get_session_dir_path() in line]
@ray.remote
def pid():
    return os.getpid()
processes = sorted(ray._private.worker._global_node.all_processes)
print(json.dumps({"processes": processes, "dashboard": ray_constants.PROCESS_TYPE_DASHBOARD,
                  "task": ray.get(pid.remote()) != os.getpid(),
                  "restored": node.Node.start_api_server is base and ray._private.services.get_node is base_get_node,
                  "agent": agent, "aiohttp": "aiohttp" in sys.modules,
                  "polled": [n["NodeID"] for n in tables[-1]] if tables else None,
                  "node": ray._private.worker._global_node.node_id,
                  "check": ray._private.utils.get_dashboard_dependency_error() is None}))
ray.shutdown()
"""


def test_a_local_ray_starts_without_monitors_or_api_server_with_a_minimal_agent_and_runs_tasks(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", LOCAL_RAY_CHILD], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["task"] and result["restored"]
    assert len(result["agent"]) == 1 and "--minimal" in result["agent"][0]  # the raylet's agent, minimal
    assert result["check"]  # Ray's own dependency check answers again after the start (ray[default] installed)
    assert not result["aiohttp"]  # the driver did not import the dashboard's dependencies
    assert result["polled"] == [result["node"]]  # the start polled the node table until its raylet was there
    assert {"gcs_server", "raylet"} <= set(result["processes"])
    assert not {result["dashboard"], "monitor", "log_monitor"} & set(result["processes"]), result["processes"]


ENTRY_EXIT_CHILD = """
import atexit, json, os, sys, time
import ray
from orchestrator import cli
from orchestrator.runtime.ray_start import init_ray
sleeps, real_sleep = [], time.sleep
time.sleep = lambda s: sleeps.append(s) or real_sleep(s)
def main():
    init_ray(None)
    node = ray._private.worker._global_node
    pids = [info.process.pid for infos in node.all_processes.values() for info in infos]
    def report():  # registered after Ray's own exit handler, so it runs before it
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        print(json.dumps({"pids": pids, "alive": alive, "sleeps": sleeps, "initialized": ray.is_initialized()}),
              flush=True)
    atexit.register(report)
    return 3
cli.main = main
cli.entry()
"""


def test_entry_shuts_its_local_ray_down_before_the_exit_handlers_without_rays_exit_sleep(tmp_path):
    """``lab``'s exit: Ray's daemons are ended by an explicit ``ray.shutdown`` before the exit handlers run,
    so Ray's own exit handler (which first sleeps 0.5 s for forwarded worker logs) has nothing left to do."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", ENTRY_EXIT_CHILD], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 3, out.stderr[-3000:]  # main's code, through os._exit
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result["pids"]) >= 2  # gcs_server and raylet at least
    assert result["alive"] == [] and result["initialized"] is False  # ended before the exit handlers ran
    assert 0.5 not in result["sleeps"]  # Ray's exit-time sleep never ran


def test_preload_analysis_imports_the_analysis_modules_in_a_thread():
    child = ("import sys\nfrom orchestrator import trial\n"
             "before = [m for m in trial.ANALYSIS_MODULES if m in sys.modules]\n"
             "trial.preload_analysis().join(120)\n"
             "print(before, [m for m in trial.ANALYSIS_MODULES if m not in sys.modules])\n"
             "trial.ANALYSIS_MODULES = ('no_such_module_xyz',)\ntrial.preload_analysis().join(10)\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", child], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded, ok = out.stdout.strip().splitlines()[-2:]
    assert loaded == "[] []" and ok == "ok"  # none before (a lean driver), all after; a failed import is quiet
