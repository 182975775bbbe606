"""SLM-Lab's ``meta.distributed`` on Ray (orchestrator/global_params.py): the global optimizer's arithmetic and
checkpoint in-process, then a 2-session synced A3C trial and its resume on the shared ``ray_local``."""

import io

import pandas as pd
import pytest
import torch
from lab_helpers import REPO, only_predir, overrides, run_cli

from agents.nets import make_optim
from orchestrator.global_params import EXACT_REASON, GlobalParams, global_dir
from orchestrator.spec.load import load_spec
from orchestrator.store import storage
from orchestrator.store.checkpoint import CheckpointStore

A3C = str(REPO / "specs/a3c.json")
SMALL = ["meta.max_session=2", "meta.log_frequency=200", "meta.random_seed=5",
         "agent.net.actor_optim_spec.name=GlobalAdam"]


def test_global_adam_steps_like_adam_and_resumes_its_state(tmp_path):
    torch.manual_seed(0)
    spec = load_spec(A3C, "a3c_cartpole", SMALL)
    predir = str(tmp_path)
    g = GlobalParams(spec, predir, 0, 5, resume=False)
    assert g.net_names == ["net"] and list(g.algorithm.optims) == ["net"]
    assert type(g.algorithm.optims["net"]) is torch.optim.Adam  # GlobalAdam is Adam, held by the global actor
    ref = [p.detach().clone().requires_grad_() for p in g.params]
    ref_opt = make_optim(ref, {"name": "Adam", "lr": 0.02})  # the lab's Adam (fused by default)
    grads = [[torch.randn_like(p) for p in ref] for _ in range(3)]
    for i, (lr, gs) in enumerate(zip((0.02, 0.01, 0.005), grads)):
        out = g.push("t0_s1", ("net",), [lr], gs)
        for p, gr in zip(ref, gs):
            p.grad = gr.clone()
        ref_opt.param_groups[0]["lr"] = lr
        ref_opt.step()
        assert all(torch.equal(a, b) for a, b in zip(out, ref)), f"push {i}"
        if i == 1:
            step, values, sha = g.checkpoint()
    assert (g.step, g.pushes) == (3, {"t0_s1": 3})
    assert step == 2 and sha != g.weights_sha256()

    # The newest global checkpoint (step 2) restores weights and Adam moments: the same third push follows.
    r = GlobalParams(spec, predir, 0, 5, resume=True)
    assert (r.step, r.pushes) == (2, {"t0_s1": 2}) and r.weights_sha256() == sha
    assert all(torch.equal(a, b) for a, b in zip(r.pull(), values))
    assert all(torch.equal(a, b) for a, b in zip(r.push("t0_s1", ("net",), [0.005], grads[2]), ref))
    with pytest.raises(ValueError, match="gradients for"):
        r.push("t0_s0", ("net",), [0.01], grads[0][:1])


def final_manifest(predir, s):
    store = CheckpointStore(str(predir / f"t0/s{s}"))
    return store.manifest(store.frames()[-1])


def global_newest(predir):
    store = CheckpointStore(global_dir(str(predir), 0))
    manifest, files = store.latest_valid()
    return manifest, torch.load(io.BytesIO(files["global.pt"]), weights_only=True)


def check_group(predir):
    """Every invariant of a finished synced trial; returns the sessions' final opt_steps."""
    manifests = [final_manifest(predir, s) for s in (0, 1)]
    opt_steps = [m.meta["clock"]["opt_step"] for m in manifests]
    g_manifest, g_state = global_newest(predir)
    # The global optimizer stepped once per push, and every push is one of the sessions' optimizer steps.
    assert g_state["step"] == g_manifest.frame == sum(opt_steps) > 0
    assert g_state["pushes"] == {"t0_s0": opt_steps[0], "t0_s1": opt_steps[1]}
    assert {int(st["step"]) for st in g_state["optims"]["net"]["state"].values()} == {sum(opt_steps)}
    for m in manifests:
        # A session's checkpoint holds the weights of the global checkpoint written at the same moment.
        assert m.meta["weights_sha256"]["net"] == m.meta["global_weights_sha256"]["net"]
        assert (m.meta["exact"], m.meta["exact_reason"]) == (False, EXACT_REASON)
    last = max(manifests, key=lambda m: m.meta["global_step"])
    assert last.meta["global_step"] == g_manifest.frame
    assert g_manifest.meta["weights_sha256"] == last.meta["global_weights_sha256"]
    return opt_steps


def test_synced_trial_trains_one_global_net_and_resumes_it(ray_local, tmp_path):
    data = str(tmp_path / "data")
    assert run_cli(A3C, "a3c_cartpole", "train", "--data-dir", data, *overrides(SMALL + ["env.max_frame=400"])) == 0
    predir = only_predir(tmp_path / "data")
    first = check_group(predir)

    assert run_cli(A3C, "a3c_cartpole", "train@latest", "--data-dir", data,
                   *overrides(SMALL + ["env.max_frame=800"])) == 0
    second = check_group(predir)  # the resumed global state counts on from its checkpoint
    assert all(b > a for a, b in zip(first, second))
    for s in (0, 1):
        df = pd.read_parquet(predir / f"t0/s{s}/train_df.parquet")
        assert df["frame"].tolist() == [200, 400, 600, 800] and df["opt_step"].is_monotonic_increasing
    run = storage.read_json(str(predir / "run.json"))
    assert run["resumes"][-1]["spec_edits"] == ["env.max_frame: 400 -> 800"]


def test_optim_step_hands_clipped_gradients_to_grad_exchange_and_loads_its_values():
    from envs.clock import Clock
    from orchestrator.session.loop import Session

    spec = load_spec(A3C, "a3c_cartpole", SMALL + ["agent.net.clip_grad_val=0.5"])
    algo = Session(spec, 5).algorithm
    params = [p for g in algo.optims["net"].param_groups for p in g["params"]]
    before = [p.detach().clone() for p in params]
    calls = []

    def exchange(optim_names, lrs, grads):
        calls.append((optim_names, lrs, [g.clone() for g in grads]))
        return [torch.full_like(g, 0.25) for g in grads]

    algo.grad_exchange = exchange
    clock = Clock(1000, 1)
    loss = sum((p * p).sum() for p in params)
    norm = algo.optim_step(loss, ("net",), clock)
    full = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(2 * b) for b in before]))
    assert norm == pytest.approx(float(full), rel=1e-6)
    ((names, lrs, grads),) = calls
    assert names == ("net",) and lrs == [0.02]
    scale = 0.5 / (full + 1e-6)
    assert all(torch.allclose(g, 2 * b * scale, rtol=1e-6, atol=0) for g, b in zip(grads, before))
    assert all(torch.equal(p.detach(), torch.full_like(p, 0.25)) for p in params)  # the exchange's values
    assert algo.optims["net"].state == {} and clock.opt_step == 1  # no local step; counted once
