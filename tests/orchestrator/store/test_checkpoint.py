"""Checkpoint store (docs/ARCHITECTURE.md section 4): commit/load, verification, fallback, retention, crash safety.

Behavioural tests run against a local directory and a local S3 server (moto, ``s3_bucket`` fixture).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from orchestrator.store import storage
from orchestrator.store.checkpoint import (
    CORRUPT_PREFIX,
    FORMAT_VERSION,
    MANIFEST_NAME,
    CheckpointError,
    CheckpointFallbackWarning,
    CheckpointStore,
    Manifest,
)

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(params=["local", "s3"])
def session_dir(request, tmp_path) -> str:
    """A fresh session directory URI on local disk and on the moto S3 server."""
    if request.param == "local":
        return str(tmp_path / "t0" / "s0")
    return storage.join(request.getfixturevalue("s3_bucket"), "run", "t0", "s0")


def _files(frame: int, size: int = 1000) -> dict[str, bytes]:
    """Deterministic checkpoint files of ``frame``: a binary blob and a small JSON state."""
    blob = random.Random(frame).randbytes(size)
    return {"model.pt": blob, "state.json": json.dumps({"frame": frame}).encode()}


def _commit_frames(store: CheckpointStore, frames: list[int]) -> None:
    """Commit a checkpoint of ``_files`` at each frame, in order."""
    for frame in frames:
        store.commit(frame, _files(frame), {"clock": {"frame": frame}})


def _ckpt_names(store: CheckpointStore) -> list[str]:
    """Entries of the store's ``ckpt/`` directory."""
    return storage.listdir(store.ckpt_dir)


# ---------------------------------------------------------------- commit / load / manifest
def test_commit_load_round_trip_and_manifest(session_dir):
    store = CheckpointStore(session_dir)
    files = _files(1200, size=5000)
    meta = {"clock": {"frame": 1200, "epi": 7}, "spec_hash": "abc", "exact": True,
            "total_reward_ma": 21.5, "versions": {"torch": "caller-set"}}
    manifest = store.commit(1200, files, meta)

    assert manifest.format_version == FORMAT_VERSION == 1
    assert manifest.frame == 1200
    assert manifest.created.endswith("+00:00")
    assert manifest.files == {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                              for name, data in files.items()}
    assert manifest.files["model.pt"]["size"] == 5000
    assert {k: v for k, v in manifest.meta.items() if k != "versions"} == {k: v for k, v in meta.items()
                                                                           if k != "versions"}
    assert manifest.meta["versions"]["torch"] == "caller-set"  # the caller's value wins
    assert set(manifest.meta["versions"]) == {"python", "torch", "gymnasium", "numpy"}
    assert manifest.meta["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert meta["versions"] == {"torch": "caller-set"}  # the caller's dict is not mutated

    assert sorted(storage.listdir(store.frame_uri(1200))) == [MANIFEST_NAME, "model.pt", "state.json"]
    assert storage.read_json(storage.join(store.frame_uri(1200), MANIFEST_NAME)) == manifest.to_json()
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert store.manifest(1200) == manifest
    loaded, loaded_files = store.load(1200)
    assert loaded == manifest
    assert loaded_files == files
    assert _ckpt_names(store) == ["000000001200"]  # no staging or replaced debris


def test_frames_ascending_and_only_committed(session_dir):
    store = CheckpointStore(session_dir)
    assert store.frames() == []
    assert store.latest_valid() is None
    _commit_frames(store, [30, 5, 200])
    storage.write_bytes(storage.join(store.ckpt_dir, "000000000007", "model.pt"), b"no manifest")
    storage.write_bytes(storage.join(store.ckpt_dir, ".staging-900-abc", MANIFEST_NAME), b"{}")
    assert store.frames() == [5, 30, 200]
    manifest, files = store.latest_valid()
    assert manifest.frame == 200
    assert files == _files(200)


def test_recommit_same_frame_replaces_it(session_dir):
    store = CheckpointStore(session_dir)
    _commit_frames(store, [10])
    store.commit(10, {"model.pt": b"new"}, {"n": 2})
    manifest, files = store.load(10)
    assert files == {"model.pt": b"new"}
    assert manifest.meta["n"] == 2
    assert _ckpt_names(store) == ["000000000010"]


def test_retention_keeps_newest_best_and_protected(session_dir):
    store = CheckpointStore(session_dir, keep=2)
    _commit_frames(store, [1, 2, 3, 4, 5, 6])
    assert store.prune(best_frame=2, protect={4}) == [1, 3]
    assert store.frames() == [2, 4, 5, 6]
    assert store.prune() == [2, 4]
    assert store.frames() == [5, 6]
    assert store.prune(best_frame=5) == []
    assert _ckpt_names(store) == ["000000000005", "000000000006"]


def test_commit_rejects_bad_input_before_writing(tmp_path):
    store = CheckpointStore(str(tmp_path))
    for name in ["", ".hidden", "a/b", MANIFEST_NAME]:
        with pytest.raises(ValueError, match="bad checkpoint file name"):
            store.commit(1, {name: b"x"}, {})
    with pytest.raises(ValueError, match=">= 0"):
        store.commit(-1, {"a": b"x"}, {})
    with pytest.raises(TypeError, match="must be bytes"):
        store.commit(1, {"a": "text"}, {})
    with pytest.raises(CheckpointError, match="frame 1 is not plain JSON"):
        store.commit(1, {"a": b"x"}, {"loss": float("nan")})
    with pytest.raises(CheckpointError, match="not plain JSON"):
        store.commit(1, {"a": b"x"}, {"obj": object()})
    assert not (tmp_path / "ckpt").exists()
    with pytest.raises(ValueError, match="keep must be >= 1"):
        CheckpointStore(str(tmp_path), keep=0)


def test_manifest_from_json_names_bad_key():
    good = {"format_version": 1, "frame": 3, "created": "2026-01-01T00:00:00+00:00",
            "files": {"a": {"size": 1, "sha256": "00"}}, "meta": {}}
    assert Manifest.from_json(good).files == {"a": {"size": 1, "sha256": "00"}}
    with pytest.raises(ValueError, match="'frame'"):
        Manifest.from_json({**good, "frame": "3"})
    with pytest.raises(ValueError, match="file 'a'"):
        Manifest.from_json({**good, "files": {"a": {"size": 1}}})


# ---------------------------------------------------------------- verification and fallback
def _flip_byte(uri: str, offset: int = 100) -> None:
    """Invert one byte of the file at ``uri``."""
    data = bytearray(storage.read_bytes(uri))
    data[offset] ^= 0xFF
    storage.write_bytes(uri, bytes(data))


def test_flipped_byte_is_set_aside_with_warning(session_dir):
    store = CheckpointStore(session_dir)
    _commit_frames(store, [100, 200, 300])
    _flip_byte(storage.join(store.frame_uri(300), "model.pt"))
    with pytest.raises(CheckpointError, match="'model.pt' fails its sha256 check"):
        store.load(300)

    with pytest.warns(CheckpointFallbackWarning) as record:
        manifest, files = store.latest_valid()
    assert manifest.frame == 200
    assert files == _files(200)
    message = str(record[0].message)
    assert "000000000300" in message and "sha256" in message and "000000000200 instead" in message
    assert store.frames() == [100, 200]
    corrupt = [n for n in _ckpt_names(store) if n.startswith(CORRUPT_PREFIX)]
    assert len(corrupt) == 1 and corrupt[0].startswith(".corrupt-300-")
    assert corrupt[0] in message
    kept = storage.join(store.ckpt_dir, corrupt[0])
    assert sorted(storage.listdir(kept)) == [MANIFEST_NAME, "model.pt", "state.json"]
    assert storage.read_bytes(storage.join(kept, "model.pt")) != _files(300)["model.pt"]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.latest_valid()[0].frame == 200  # no second warning: it is set aside


@pytest.mark.parametrize("damage", ["truncate", "delete_file", "bad_manifest"])
def test_other_damage_falls_back(tmp_path, damage):
    store = CheckpointStore(str(tmp_path))
    _commit_frames(store, [1, 2])
    target = store.frame_uri(2)
    if damage == "truncate":
        storage.write_bytes(storage.join(target, "model.pt"), _files(2)["model.pt"][:-1])
    elif damage == "delete_file":
        storage.delete(storage.join(target, "state.json"))
    else:
        storage.write_bytes(storage.join(target, MANIFEST_NAME), b'{"format_version": 1, "fr')
    with pytest.warns(CheckpointFallbackWarning, match="000000000002"):
        assert store.latest_valid()[0].frame == 1


def test_all_corrupt_raises_and_keeps_raising(session_dir):
    store = CheckpointStore(session_dir)
    _commit_frames(store, [5])
    _flip_byte(storage.join(store.frame_uri(5), "state.json"), offset=2)
    with pytest.raises(CheckpointError, match="no valid checkpoint.*000000000005"):
        store.latest_valid()
    with pytest.raises(CheckpointError, match=r"earlier set aside: \.corrupt-5-"):
        store.latest_valid()  # never silently start from scratch
    assert store.frames() == []


def test_newer_format_is_an_error_not_corruption(tmp_path):
    store = CheckpointStore(str(tmp_path))
    manifest = store.commit(1, _files(1), {})
    storage.write_json(storage.join(store.frame_uri(1), MANIFEST_NAME),
                       {**manifest.to_json(), "format_version": FORMAT_VERSION + 1})
    with pytest.raises(CheckpointError, match="upgrade the lab"):
        store.latest_valid()
    assert store.frames() == [1]  # not set aside


# ---------------------------------------------------------------- debris of killed writers
def _simulate_killed_replacement(store: CheckpointStore, frame: int, new_committed: bool) -> str:
    """Leave ``ckpt/`` as a writer killed while replacing ``frame`` would: returns the set-aside URI."""
    aside = storage.join(store.ckpt_dir, f".replaced-{frame}-0123abcd")
    storage.copy_tree(store.frame_uri(frame), aside, last=MANIFEST_NAME)
    storage.delete(store.frame_uri(frame))
    if new_committed:
        store.commit(frame, {"model.pt": b"new"}, {})
    storage.write_bytes(storage.join(store.ckpt_dir, f".staging-{frame}-4567cdef", "model.pt"), b"part")
    return aside


def test_interrupted_replacement_is_rolled_back(session_dir):
    store = CheckpointStore(session_dir)
    _commit_frames(store, [10, 20])
    _simulate_killed_replacement(store, 20, new_committed=False)
    assert store.frames() == [10]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        manifest, files = store.latest_valid()
    assert manifest.frame == 20 and files == _files(20)
    store.collect_garbage()
    assert _ckpt_names(store) == ["000000000010", "000000000020"]


def test_finished_replacement_drops_old_copy(session_dir):
    store = CheckpointStore(session_dir)
    _commit_frames(store, [10, 20])
    _simulate_killed_replacement(store, 20, new_committed=True)
    store.collect_garbage()
    assert _ckpt_names(store) == ["000000000010", "000000000020"]
    assert store.load(20)[1] == {"model.pt": b"new"}


def test_collect_garbage_removes_debris_keeps_corrupt(session_dir):
    store = CheckpointStore(session_dir)
    _commit_frames(store, [1])
    storage.write_bytes(storage.join(store.ckpt_dir, ".staging-2-aa", "model.pt"), b"x")
    storage.write_bytes(storage.join(store.ckpt_dir, "000000000003", "model.pt"), b"uncommitted")
    storage.write_bytes(storage.join(store.ckpt_dir, ".corrupt-0-bb", "model.pt"), b"evidence")
    store.collect_garbage()
    assert _ckpt_names(store) == [".corrupt-0-bb", "000000000001"]


class _RacedFS:
    """A filesystem whose delete_dir finds the tree deleted by another process first (as pyarrow's S3 client
    reports it: OSError "Path does not exist") after that other process's delete."""

    def __init__(self, fs):
        self.fs = fs

    def __getattr__(self, name):
        return getattr(self.fs, name)

    def delete_dir(self, path):
        self.fs.delete_dir(path)  # the other process's delete
        raise OSError(f"Path does not exist '{path}/'")


def test_collect_garbage_tolerates_a_concurrent_delete_of_the_same_debris(session_dir, monkeypatch):
    """A tree deleted by someone else between the lookup and the delete is "missing", which is fine; a delete
    that fails with the tree still there is still an error."""
    store = CheckpointStore(session_dir)
    _commit_frames(store, [1])
    storage.write_bytes(storage.join(store.ckpt_dir, "000000000003", "model.pt"), b"uncommitted")
    resolve = storage.resolve
    monkeypatch.setattr(storage, "resolve", lambda uri: (_RacedFS(resolve(uri)[0]), resolve(uri)[1]))
    store.collect_garbage()
    assert _ckpt_names(store) == ["000000000001"]

    class _Failing(_RacedFS):
        def delete_dir(self, path):
            raise OSError("permission denied")
    storage.write_bytes(storage.join(store.ckpt_dir, "000000000004", "model.pt"), b"uncommitted")
    monkeypatch.setattr(storage, "resolve", lambda uri: (_Failing(resolve(uri)[0]), resolve(uri)[1]))
    with pytest.raises(CheckpointError, match="permission denied"):
        store.collect_garbage()


# ---------------------------------------------------------------- crash safety (SIGKILL)
WRITER = textwrap.dedent("""
    import json, os, random, sys
    from orchestrator.store.checkpoint import CheckpointStore

    session_dir, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    store = CheckpointStore(session_dir, keep=3)
    store.collect_garbage()                         # what a resuming session does first
    latest = store.latest_valid()
    frame = latest[0].frame if latest else 0        # re-commit the newest frame: replacement path
    print("ready", flush=True)
    while True:
        blob = os.urandom(rng.randint(100_000, 1_000_000))
        state = json.dumps({"frame": frame, "size": len(blob)}).encode()
        store.commit(frame, {"model.bin": blob, "state.json": state}, {"clock": {"frame": frame}})
        print(f"committed {frame}", flush=True)
        store.prune(best_frame=1 if frame > 1 else None)
        frame += 1
""")


def _run_and_kill(session_dir: str, seed: int, delay_s: float) -> tuple[list[int], str]:
    """Start a writer, SIGKILL it ``delay_s`` seconds after it is ready; its committed frames and stderr."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, session_dir, str(seed)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT)
    try:
        ready = proc.stdout.readline()
        assert ready == "ready\n", f"writer failed to start: {ready!r} {proc.stderr.read()}"
        time.sleep(delay_s)
        assert proc.poll() is None, f"writer died by itself: {proc.stderr.read()}"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    out, err = proc.communicate(timeout=30)
    return [int(line.split()[1]) for line in out.splitlines() if line.startswith("committed ")], err


def _check_after_kill(store: CheckpointStore, committed: list[int], newest_before: int) -> tuple[int, bool]:
    """latest_valid verifies, is the newest committed checkpoint, and loses no reported commit."""
    names = _ckpt_names(store)
    debris = any(n.startswith((".staging-", ".replaced-")) for n in names)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback would mean a half checkpoint was committed
        latest = store.latest_valid()
    if latest is None:  # killed before its first commit ever finished
        assert not committed and newest_before < 0 and store.frames() == []
        return newest_before, debris
    manifest, files = latest
    assert manifest.frame == store.frames()[-1]
    assert manifest.frame >= max(committed, default=newest_before)
    state = json.loads(files["state.json"])
    assert state == {"frame": manifest.frame, "size": len(files["model.bin"])}
    assert manifest.meta["clock"] == {"frame": manifest.frame}
    assert not any(n.startswith(CORRUPT_PREFIX) for n in _ckpt_names(store))
    return manifest.frame, debris


def _crash_loop(session_dir: str, kills: int, seed: int) -> int:
    """Kill ``kills`` writers at seeded random moments; returns how many kills left debris behind."""
    rng = random.Random(seed)
    store = CheckpointStore(session_dir, keep=3)
    newest, debris_count = -1, 0
    for i in range(kills):
        committed, _ = _run_and_kill(session_dir, seed=i, delay_s=rng.uniform(0.05, 0.6))
        newest, debris = _check_after_kill(store, committed, newest)
        debris_count += debris
    store.collect_garbage()
    assert not [n for n in _ckpt_names(store) if n.startswith(".")]
    # a kill between a commit and its prune may leave one extra checkpoint; the next prune removes it
    store.prune(best_frame=1)
    assert newest >= 0 and len(store.frames()) <= 4  # keep=3 newest + the best
    return debris_count


def test_sigkilled_writer_never_leaves_a_half_checkpoint(tmp_path):
    debris_kills = _crash_loop(str(tmp_path / "s0"), kills=30, seed=1234)
    assert debris_kills >= 1  # some kills did land in the middle of a commit


def test_sigkilled_writer_on_s3(s3_bucket):
    _crash_loop(storage.join(s3_bucket, "run", "s0"), kills=6, seed=99)


# ---------------------------------------------------------------- object-store errors
def test_missing_bucket_raises_fast(s3_server):
    uri = "s3://no-such-bucket-7f3a/run/t0/s0"
    start = time.monotonic()
    with pytest.raises(storage.StorageError, match="no-such-bucket-7f3a"):
        storage.write_bytes(storage.join(uri, "f"), b"x")
    for probe in (storage.exists, storage.listdir, storage.read_bytes, storage.delete):
        with pytest.raises(storage.StorageError, match="bucket 'no-such-bucket-7f3a'.*does not exist"):
            probe(storage.join(uri, "f"))
    store = CheckpointStore(uri)
    with pytest.raises(CheckpointError, match="does not exist"):
        store.latest_valid()
    with pytest.raises(CheckpointError, match="cannot commit checkpoint"):
        store.commit(1, {"a": b"x"}, {})
    assert time.monotonic() - start < 10


def test_storage_move_and_copy_rules(tmp_path, s3_bucket):
    src, dst = str(tmp_path / "a"), str(tmp_path / "b")
    storage.write_bytes(storage.join(src, "x", "f"), b"1")
    storage.write_bytes(storage.join(src, "m"), b"2")
    assert storage.copy_tree(src, dst, last="m") == ["x/f", "m"]
    assert storage.list_files(dst) == ["m", "x/f"]
    with pytest.raises(storage.StorageError, match="destination exists"):
        storage.move(src, dst)
    storage.move(src, str(tmp_path / "c"))
    assert storage.read_bytes(str(tmp_path / "c" / "x" / "f")) == b"1"
    with pytest.raises(storage.StorageError, match="no rename"):
        storage.move(storage.join(s3_bucket, "a"), storage.join(s3_bucket, "b"))
    with pytest.raises(storage.StorageError, match="same kind of store"):
        storage.copy_tree(dst, storage.join(s3_bucket, "b"))
    storage.write_bytes(storage.join(s3_bucket, "a", "x", "f"), b"3")
    assert storage.copy_tree(storage.join(s3_bucket, "a"), storage.join(s3_bucket, "b")) == ["x/f"]
    assert storage.read_bytes(storage.join(s3_bucket, "b", "x", "f")) == b"3"


def test_copy_to_gives_the_target_the_sources_state_at_a_frame_and_its_user_copies(tmp_path):
    """``copy_to`` (a PBT exploit): the target's own checkpoints go, the source's up to the frame come (later ones
    do not), and the user copies are the source checkpoint's, a copy the checkpoint lacks deleted."""
    src, dst = CheckpointStore(str(tmp_path / "src")), CheckpointStore(str(tmp_path / "dst"))
    for frame in (100, 200, 300):
        src.commit(frame, {"state.pt": b"s%d" % frame, "train_df.parquet": b"df%d" % frame}, {"total_reward_ma": 1.0})
    dst.commit(400, {"state.pt": b"mine", "train_df.parquet": b"mine"}, {"total_reward_ma": 2.0})
    (tmp_path / "dst" / "eval_df.parquet").write_bytes(b"stale")
    src.copy_to(dst, 200)
    assert dst.frames() == [100, 200] and dst.load(200)[1]["state.pt"] == b"s200"
    assert (tmp_path / "dst" / "train_df.parquet").read_bytes() == b"df200"
    assert not (tmp_path / "dst" / "eval_df.parquet").exists()
    src.copy_to(dst, 200)  # again (a kill mid-copy): the same result
    assert dst.frames() == [100, 200]
    assert dst.export({"train_df.parquet": b"df200"}, changed_only=True) == []
    assert dst.export({"train_df.parquet": b"new"}, changed_only=True) == ["train_df.parquet"]
