"""A real two-node Ray cluster, started the way a user starts one: ``ray start --head`` and ``ray start
--address`` (each with its own temp dir and free ports), the lab driving it with ``--address`` and an
``s3://`` data dir on the local test S3 server, and ``ray job submit -- lab ...``.

The sessions of a 4-session ``train`` are spread over both nodes (run.json records each session's
``node_id``); the second node is then lost (its raylet is SIGKILLed by PID) and its sessions come back
on the head from their checkpoints. Every process ``ray start`` left behind is killed by PID at the end
(never ``ray stop``: other Ray clusters may share the machine).

Speed knobs of the test cluster, not of the lab: the head's GCS declares a node dead after 3 missed
health checks 0.5 s apart (Ray's default is 5 missed checks 3 s apart), through ``RAY_health_check_*``
variables in the environment of ``ray start --head``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
from lab_helpers import DRIVER_ENV, REPO, SPECS, assert_continuous, descendants, kill_pids, overrides, uninterrupted_df

from orchestrator import errors as errors_mod
from orchestrator.runtime import ray_start as ray_start_mod
from orchestrator.store import storage

RAY = str(Path(sys.executable).with_name("ray"))
LAB = str(Path(sys.executable).with_name("lab"))
TINY = ["env.num_envs=4", "agent.algorithm.training_epoch=2", "meta.random_seed=3",
        'meta.resources={"num_cpus": 1, "num_gpus": 0}']
FAST_NODE_DEATH = {"RAY_health_check_initial_delay_ms": "0", "RAY_health_check_period_ms": "500",
                   "RAY_health_check_timeout_ms": "500", "RAY_health_check_failure_threshold": "3"}


def ephemeral_range() -> tuple[int, int]:
    """(first, last) of the kernel's ephemeral ports, where ``bind(0)`` picks (Linux default 32768-60999)."""
    try:
        first, last = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(first), int(last)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(n: int, taken: set[int]) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now and not in ``taken``; adds them to ``taken``.

    ``taken`` holds every port the cluster already gave a component (a worker-port range is not bound
    until its workers start, so a free-now check alone can hand the same port to two components).
    """
    socks, out = [], []
    try:
        while len(out) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)  # held until the end: the kernel does not hand the same port twice
            port = s.getsockname()[1]
            if port not in taken:
                out.append(port)
        taken.update(out)
        return out
    finally:
        for s in socks:
            s.close()


def free_range(width: int, taken: set[int]) -> tuple[int, int]:
    """(first, last) of ``width`` consecutive ports free now, outside ``taken``; adds them to ``taken``.

    Drawn below the kernel's ephemeral range, so no later ``bind(0)`` (``free_ports``, a Ray component
    asking for a random port) can land inside it.
    """
    top = ephemeral_range()[0]
    for _ in range(200):
        first = random.randrange(20000, top - width)  # above Ray's defaults (6379, 8265, 10001)
        ports = set(range(first, first + width))
        if ports & taken:
            continue
        socks = []
        try:
            for port in sorted(ports):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        taken.update(ports)
        return first, first + width - 1
    raise RuntimeError("no free port range")


def group_members(pgid: int) -> list[int]:
    """PIDs of the processes in process group ``pgid`` (read from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


@dataclass
class Node:
    """One ``ray start`` of the test: its process group (every daemon it leaves keeps it), temp dir."""

    pgid: int
    temp_dir: Path
    output: str
    raylet_pid: int = 0
    node_id: str = ""

    def find_raylet(self) -> None:
        """The node's raylet (the member of its process group running ``raylet``) and its node id."""
        for pid in group_members(self.pgid):
            args = cmdline(pid)
            if args and args[0].endswith("/raylet") and any(a.startswith(f"--session_dir={self.temp_dir}")
                                                            for a in args):
                self.raylet_pid = pid
                self.node_id = next(a.split("=", 1)[1] for a in args if a.startswith("--node_id="))
                return
        raise AssertionError(f"no raylet in process group {self.pgid}:\n{self.output}")


@dataclass
class Cluster:
    """A head and worker nodes started with ``ray start`` on this machine."""

    root: Path
    env: dict[str, str]
    nodes: list[Node] = field(default_factory=list)
    address: str = ""
    dashboard: str = ""
    taken: set[int] = field(default_factory=set)  # every port given to a component of this cluster

    def ray_start(self, name: str, *args: str, extra_env: dict[str, str] | None = None) -> Node:
        temp_dir = self.root / name
        lo, hi = free_range(40, self.taken)
        ports = free_ports(6, self.taken)
        cmd = [RAY, "start", f"--temp-dir={temp_dir}", "--num-cpus=2", "--disable-usage-stats",
               f"--node-manager-port={ports[0]}", f"--object-manager-port={ports[1]}",
               f"--min-worker-port={lo}", f"--max-worker-port={hi}",
               f"--dashboard-agent-listen-port={ports[2]}", f"--dashboard-agent-grpc-port={ports[3]}",
               f"--runtime-env-agent-port={ports[4]}", f"--metrics-export-port={ports[5]}", *args]
        proc = subprocess.Popen(cmd, env={**self.env, **(extra_env or {})}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        node = Node(proc.pid, temp_dir, "")
        self.nodes.append(node)  # before waiting: the finalizer kills its group whatever happens
        node.output = proc.communicate(timeout=120)[0]
        assert proc.returncode == 0, node.output
        node.find_raylet()
        return node

    def start_head(self) -> Node:
        port, client, dash = free_ports(3, self.taken)
        self.address = f"127.0.0.1:{port}"
        self.dashboard = f"http://127.0.0.1:{dash}"
        # the dashboard serves `ray job submit` (it needs ray[default], in the test extra)
        return self.ray_start("head", "--head", f"--port={port}", f"--ray-client-server-port={client}",
                              "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
                              extra_env=FAST_NODE_DEATH)

    def add_node(self, resources: dict[str, float]) -> Node:
        return self.ray_start(f"node{len(self.nodes)}", f"--address={self.address}",
                              f"--resources={json.dumps(resources)}")

    def kill_all(self) -> None:
        """SIGKILL every process the ``ray start`` calls left (their process groups and descendants)."""
        pids = []
        for node in self.nodes:
            members = group_members(node.pgid)
            pids += members + [d for pid in members for d in descendants(pid)]
        kill_pids(sorted(set(pids)))


@contextmanager
def two_nodes(env: dict[str, str], resources: dict[str, float]):
    """A started head and a second node with custom ``resources`` (2 CPUs each), in a fresh folder directly under
    the system temp dir (Ray's socket paths below a cluster's temp dir must fit 107 bytes, which pytest's temp dirs
    can exceed); every process and the folder are removed at the end."""
    path = Path(tempfile.mkdtemp(prefix="ray-"))
    c = Cluster(path, env)
    try:
        c.start_head()
        c.add_node(resources)
        yield c
    finally:
        c.kill_all()
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(s3_server):
    """A head (2 CPUs, dashboard for jobs) and a second node (2 CPUs, resource ``worker_node``).

    Started after ``s3_server`` set the AWS_* variables: the raylets pass them to every worker.
    """
    with two_nodes({**os.environ, **DRIVER_ENV}, {"worker_node": 2}) as c:
        yield c


def zipped_bytes(root: Path) -> int:
    """Bytes of the ``.zip`` files under ``root`` (Ray's packages of a driver's working directory)."""
    total = 0
    for path in root.rglob("*.zip"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # uploaded and removed meanwhile
            pass
    return total


def one_run(data: str) -> str:
    (name,) = [n for n in storage.listdir(data) if n.startswith("ppo_cartpole_")]
    return f"{data}/{name}"


def test_search_submitted_as_a_ray_job(cluster, s3_bucket):
    """``ray job submit -- lab ... search --address HEAD``: the job's driver runs on the head."""
    data = f"{s3_bucket}/runs"
    grid = 'search={"agent": {"algorithm": {"gamma__grid_search": [0.9, 0.99]}}}'
    entry = [LAB, SPECS, "ppo_cartpole", "search", "--address", cluster.address, "--data-dir", data, "--quiet",
             *overrides(TINY + ["meta.max_session=2", "env.max_frame=1024", "meta.log_frequency=512", grid])]
    proc = subprocess.run([RAY, "job", "submit", "--address", cluster.dashboard, "--", *entry], env=cluster.env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "search done" in proc.stdout and "succeeded" in proc.stdout
    predir = one_run(data)
    exp = storage.read_parquet(f"{predir}/info/experiment_df.parquet")
    assert sorted(exp["agent.algorithm.gamma"]) == [0.9, 0.99] and set(exp["status"]) == {"done"}
    sessions = storage.read_json(f"{predir}/run.json")["sessions"]
    assert sorted(sessions) == ["t0_s0", "t0_s1", "t1_s0", "t1_s1"]
    assert {s["status"] for s in sessions.values()} == {"done"}
    # 4 one-CPU sessions at once need both 2-CPU nodes
    assert {s["node_id"] for s in sessions.values()} == {n.node_id for n in cluster.nodes}
    for t in (0, 1):
        for s in (0, 1):
            assert storage.read_parquet(f"{predir}/t{t}/s{s}/train_df.parquet")["frame"].tolist() == [512, 1024]


MAX_FRAME = 16384  # long enough that the worker's sessions are still training when its raylet is killed


def test_train_over_two_nodes_survives_losing_one(cluster, s3_bucket):
    """Last in this file: it ends the second node."""
    head, worker = cluster.nodes
    data = f"{s3_bucket}/train"
    items = TINY + ["meta.max_session=4", f"env.max_frame={MAX_FRAME}", "meta.log_frequency=1024",
                    "meta.checkpoint_frequency=1024"]
    # run from the directory that holds the nodes' Ray temp dirs: the working directory sent to the cluster
    # leaves them out (Ray's zip of it is written inside them)
    proc = subprocess.Popen([LAB, SPECS, "ppo_cartpole", "train", "--data-dir", data, "--address", cluster.address,
                             "--quiet", *overrides(items)], env=cluster.env, cwd=cluster.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline, lost = time.time() + 180, None
        while lost is None:
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
            # the working directory goes to the cluster without the nodes' Ray temp dirs (zipped, they would hold
            # the zip itself, which then grows until the disk is full)
            assert zipped_bytes(cluster.root) < 10 * 2**20
            time.sleep(0.2)
            try:
                sessions = storage.read_json(f"{one_run(data)}/run.json")["sessions"]
            except (ValueError, FileNotFoundError):
                continue
            on_worker = {k for k, s in sessions.items() if s.get("node_id") == worker.node_id}
            running = {k for k in on_worker if sessions[k].get("status") != "done"}  # a finished one is not lost
            if len(sessions) == 4 and all("node_id" in s for s in sessions.values()) and running \
                    and all(sessions[k].get("checkpoint", 0) >= 1024 for k in running):
                lost, finished_on_worker = {k: sessions[k]["checkpoint"] for k in running}, on_worker - running
                os.kill(worker.raylet_pid, signal.SIGKILL)  # the second node is lost mid-run
        out, err = proc.communicate(timeout=240)
    finally:
        kill_pids([proc.pid, *descendants(proc.pid)])
    assert proc.returncode == 0, err[-3000:]
    predir = one_run(data)
    sessions = storage.read_json(f"{predir}/run.json")["sessions"]
    assert 0 < len(lost) < 4  # both nodes were used
    # a worker session may finish in the moment between the check and the kill: it is not lost then
    restarted = {k for k in lost if sessions[k]["restarts"]}
    assert restarted, "no session came back from the lost node"
    for key, entry in sessions.items():
        node = head.node_id if key in restarted or key not in {*lost, *finished_on_worker} else worker.node_id
        assert entry["status"] == "done" and entry["frame"] == MAX_FRAME and entry["node_id"] == node
        if key in restarted:  # came back on the head from its checkpoint
            (restart,) = entry["restarts"]
            assert restart["node_id"] == worker.node_id and restart["frame_restored"] >= lost[key]
        else:
            assert entry["restarts"] == []
        t, s = key.split("_")
        assert_continuous(storage.read_parquet(f"{predir}/{t}/{s}/train_df.parquet"), 1024, MAX_FRAME)
    # a session restored on the head continued exactly: its train_df is the uninterrupted run's
    key = min(restarted)
    resumed = storage.read_parquet(f"{predir}/t0/s{key[-1]}/train_df.parquet")
    straight = uninterrupted_df(items, int(key[-1]))
    pd.testing.assert_frame_equal(resumed.drop(columns=["wall_t", "fps"]), straight.drop(columns=["wall_t", "fps"]))


def test_dashboard_flag_needs_the_dashboards_packages(monkeypatch, capsys):
    import ray
    import ray._private.utils as ray_utils


    started = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: started.append(kw))
    monkeypatch.setattr(ray_utils, "get_dashboard_dependency_error", lambda: "No module named 'aiohttp'")
    with pytest.raises(errors_mod.UsageError, match=r"--dashboard needs .*rl-trial-lab\[cluster\]"):
        ray_start_mod.init_ray(None, dashboard=True)
    ray_start_mod.init_ray("127.0.0.1:1", dashboard=True)  # joining a cluster: its head has the dashboard or not
    ray_start_mod.init_ray(None)
    assert [(kw["address"], kw["include_dashboard"]) for kw in started] == [("127.0.0.1:1", False),
                                                                          ("local", False)]


def committed_frames(session_dir: Path) -> list[int]:
    """Frames of the checkpoints committed in a session directory (its ``ckpt/{frame:012d}`` names)."""
    return [int(n) for n in storage.listdir(str(session_dir / "ckpt")) if n.isdigit()]


@pytest.fixture
def spot_cluster():
    """A head and a second node (2 CPUs each) whose workers can import ``tests.fault_envs`` (PYTHONPATH)."""
    env = {**os.environ, **DRIVER_ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                                     os.environ.get("PYTHONPATH")]))}
    with two_nodes(env, {"spot": 2}) as c:
        yield c


@pytest.mark.parametrize("sessions, batch", [(3, []), (6, ["meta.session_batch=2"])], ids=["sessions", "seed_groups"])
def test_drained_node_hands_its_sessions_over_from_a_checkpoint_taken_after_the_notice(spot_cluster, tmp_path,
                                                                                       sessions, batch):
    """``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds 30`` of the second node
    while its sessions train: each commits a checkpoint at once (later than its last periodic one) and restarts
    on the head from it (``cause: preempted`` in run.json, nothing lost); the run completes with every log row.

    3 one-CPU sessions on two 2-CPU nodes: each node hosts one at least; or 6 sessions in three one-CPU seed groups
    of 2 (``meta.session_batch``), a drained group moving as a whole.
    ``SlowCartPole`` trains at most ~1,000 frames/s, so the notice lands between periodic checkpoints (every 8,192
    frames)."""
    head, spot = spot_cluster.nodes
    data = tmp_path / "data"
    items = TINY + [f"meta.max_session={sessions}", "env.name=tests.fault_envs:SlowCartPole-v0",
                    "env.max_frame=16384", "meta.log_frequency=1024", "meta.checkpoint_frequency=8192",
                    "meta.max_restarts=0", *batch]
    proc = subprocess.Popen([LAB, SPECS, "ppo_cartpole", "train", "--data-dir", str(data), "--address",
                             spot_cluster.address, "--quiet", *overrides(items)], env=spot_cluster.env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline, periodic, plans = time.time() + 240, None, {}
        while periodic is None:
            if proc.poll() is not None or time.time() > deadline:
                kill_pids([proc.pid, *descendants(proc.pid)])
                raise AssertionError(f"{plans}\n{proc.communicate()[1][-3000:]}")
            time.sleep(0.2)
            try:
                (predir,) = data.glob("ppo_cartpole_*")
                plans = storage.read_json(str(predir / "run.json"))["sessions"]
            except (ValueError, FileNotFoundError):
                continue
            on_spot = {k for k, s in plans.items() if s.get("node_id") == spot.node_id}
            # the checkpoints themselves: a commit reaches run.json only with the next one (one write in flight)
            committed = {k: committed_frames(predir / k.replace("_", "/")) for k in on_spot}
            if len(plans) == sessions and on_spot and \
                    all(max(committed[k], default=0) >= 8192 for k in on_spot):
                periodic = {k: max(committed_frames(predir / k.replace("_", "/"))) for k in on_spot}
                subprocess.run([RAY, "drain-node", "--address", spot_cluster.address, "--node-id", spot.node_id,
                                "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot notice",
                                "--deadline-remaining-seconds", "30"], env=spot_cluster.env, check=True, timeout=60)
        out, err = proc.communicate(timeout=180)
    finally:
        kill_pids([proc.pid, *descendants(proc.pid)])
    assert proc.returncode == 0, err[-3000:]
    plans = storage.read_json(str(predir / "run.json"))["sessions"]
    assert 0 < len(periodic) < sessions  # both nodes were used
    if batch:  # whole groups moved
        assert {f"t0_s{int(k[-1]) ^ 1}" for k in periodic} == set(periodic), periodic
    for key, entry in plans.items():
        assert entry["status"] == "done" and entry["frame"] == 16384 and entry["node_id"] == head.node_id
        if key in periodic:  # moved from the drained node
            (restart,) = entry["restarts"]
            assert restart["cause"] == "preempted" and restart["reason"] == "node draining"
            assert restart["node_id"] == spot.node_id and restart["frames_lost"] == 0
            assert restart["frame_restored"] > periodic[key]  # committed after the notice
            assert f"session {key}: its node {spot.node_id} is draining" in err
        else:
            assert entry["restarts"] == []
        t, s = key.split("_")
        assert_continuous(pd.read_parquet(predir / t / s / "train_df.parquet"), 1024, 16384)
