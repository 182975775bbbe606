"""Throughput benchmark: env frames per second of our sessions vs Stable-Baselines3, same hyperparameters.

``--algo ppo`` (default): PPO on CartPole-v1 with rl-baselines3-zoo's ``ppo.yml`` settings (as
``specs/benchmark/cartpole.json`` ``ppo_cartpole``): 8 envs, n_steps/time_horizon 32, batch 256, 20 epochs,
gamma 0.98, GAE lambda 0.8, lr 1e-3 and clip 0.2 both linear to 0 over the frame budget, no entropy bonus,
separate 64-64 tanh actor and critic, Adam eps 1e-5, grad clip 0.5.
``--algo dqn``: DQN on CartPole-v1 with zoo's ``dqn.yml`` settings (``dqn_cartpole`` overridden): 1 env,
256-256 ReLU net, batch 64, lr 2.3e-3, buffer 100k, learning starts 1,000, train_freq 256 with 128 gradient
steps, target replaced every 10 frames, epsilon 1 -> 0.04 over 16% of the budget, Huber loss, grad clip 10.
``--algo ppo_atari``: SLM-Lab's Atari PPO (``specs/benchmark/atari.json`` ``ppo_atari``: Nature CNN, 4 stacked
84x84 frames, 128 steps, 4 epochs of batch 256, clip 0.1 with the value loss clipped, entropy 0.01, AdamW lr 2.5e-4
linear to 0, grad clip 0.5) on ``ALE/Pong-v5`` with 8 envs, against SB3's ``CnnPolicy`` on ``make_atari_env``
(AtariWrapper) + ``VecFrameStack(4)`` with the same settings and sticky actions 0.25.
``--algo sac_hopper``: SAC on ``Hopper-v5`` with rl-zoo's MuJoCo settings (lr 3e-4, batch 256, tau 0.005, 256-256
nets, one gradient step per frame) but learning from frame 1,000 (zoo: 10,000) so a short budget is mostly training.
``--algo sac``: SAC on Pendulum-v1 with zoo's ``sac.yml`` settings (``sac_pendulum`` overridden): 1 env,
lr 1e-3, buffer 1M, learning starts 100, batch 256, tau 0.005, one gradient step per frame, 256-256 nets,
automatic temperature.

All with ``torch.set_num_threads(1)``, nets on the CPU unless ``--device cuda``: then ours runs with
``agent.net.gpu: true`` and SB3 with ``device="cuda"`` (nets, updates and replay sampling on the GPU; the envs
and the Python of both loops on one CPU thread). Runs alternate (ours, SB3, ours, SB3, ...), so both see the same
machine load over time, each in a fresh process of its own (``multiprocessing`` spawn): process-wide state one
library sets (ours: CPU denormals flushed, ``session.seed_globals``; glibc's malloc kept from unmapping freed
buffers, ``orchestrator.runtime.allocator``) never carries
over to the other's run, which is how each runs for its users.
``--same-process`` runs them all in this process instead (the method of the figures before stop 39).
Only the training loop is timed: ``Session.run_rl()`` for ours
(the session, its envs and nets are built before the timer starts) and ``learn()`` for SB3 (the model and its
vector env are built before).

With ``--sb3-ftz`` / ``--sb3-malloc`` a further run per round, ``sb3+ftz`` / ``sb3+malloc``, is SB3 in a process
given the CPU denormal flush / the glibc allocator setting that our sessions make for themselves (SB3 makes
neither), so a ratio can be read without either.

With ``--bf16`` a further run per round, ``ours+bf16``, is ours with ``agent.net.precision: bfloat16`` (conv
nets under bfloat16 autocast; SB3 has no such setting, so it runs float32).

With ``--tracking`` a third run per round, ``ours+tb``, trains the same spec the way a session actor does:
``SessionRunner`` in a temporary run directory, with its checkpoints at the default cadence and its
TensorBoard event files (on by default), timed over the whole event stream (tracker start, training,
every checkpoint and tracker write, the last write, close); the runner (session, envs, nets) is built before
the timer starts, as for the other two.

``--vectorization`` sets ours' ``env.vectorization`` (``--num-cpus``: its ``meta.resources.num_cpus``, EnvPool's
threads); with ``--envpool`` a further run per round, ``ours+envpool``, is ours on EnvPool (``env.vectorization:
envpool``). The table's vectorization column names each run's vector env as it ran (``envpool/1t``: one thread).

fps = env frames / wall seconds of the loop. Because the box is shared, CPU seconds of this
process over the loop are recorded too (``frames_per_cpu_s``), which is much less sensitive to
other load than wall time. For PPO the frame budget is a multiple of 256 (one rollout of 8 x 32), so
both do the same number of rollouts and gradient steps.

Usage:
    python bench/throughput.py [--algo ppo|dqn|sac|ppo_atari|sac_hopper] [--frames N] [--rounds 2] [--seed 1]
        [--tracking] [--sb3-ftz] [--sb3-malloc] [--bf16] [--device cpu|cuda] [--same-process]
        [--vectorization spec|sync|async|auto|envpool] [--num-cpus N] [--envpool]
        [--out bench/results/throughput[_{algo}].json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from orchestrator.session.loop import Session  # noqa: E402
from orchestrator.spec.load import load_spec  # noqa: E402
from orchestrator.store import storage  # noqa: E402

SPECS = ROOT / "specs/benchmark"

# rl-baselines3-zoo hyperparameters per algorithm, as lab overrides of a benchmark spec and as SB3 kwargs.
ZOO: dict[str, dict[str, Any]] = {
    "ppo": {"file": "cartpole.json", "name": "ppo_cartpole", "frames": 51_200, "env": "CartPole-v1", "n_envs": 8,
            "overrides": lambda f: [f"agent.net.lr_scheduler_spec.frame={f}",
                                    f"agent.algorithm.clip_eps_spec.end_step={f}"]},
    "dqn": {"file": "cartpole.json", "name": "dqn_cartpole", "frames": 50_000, "env": "CartPole-v1", "n_envs": 1,
            "overrides": lambda f: [
                "agent.net.hid_layers=[256, 256]", "agent.memory.batch_size=64", "agent.memory.max_size=100000",
                'agent.net.optim_spec={"name": "Adam", "lr": 0.0023}', "agent.net.lr_scheduler_spec=null",
                "agent.algorithm.training_start_step=1000", "agent.algorithm.training_frequency=256",
                "agent.algorithm.training_iter=128", "agent.algorithm.training_batch_iter=1",
                "agent.net.update_type=replace", "agent.net.update_frequency=10", "agent.net.clip_grad_val=10",
                'agent.algorithm.explore_var_spec={"name": "linear_decay", "start_val": 1.0, "end_val": 0.04, '
                f'"start_step": 0, "end_step": {int(0.16 * f)}}}', "env.num_envs=1"]},
    "sac": {"file": "pendulum.json", "name": "sac_pendulum", "frames": 10_000, "env": "Pendulum-v1", "n_envs": 1,
            "overrides": lambda f: [
                "env.num_envs=1", "agent.algorithm.training_iter=1", "agent.algorithm.training_frequency=1",
                "agent.algorithm.training_start_step=100", "agent.memory.batch_size=256",
                "agent.memory.max_size=1000000", 'agent.net.optim_spec={"name": "Adam", "lr": 0.001}',
                "agent.net.hid_layers=[256, 256]", "agent.net.polyak_coef=0.005"]},
    # SLM-Lab's Atari PPO (specs/benchmark/atari.json ppo_atari = SLM-Lab v5.3's ppo_atari) on Pong with 8 envs
    "ppo_atari": {"file": "atari.json", "name": "ppo_atari", "frames": 10_240, "env": "ALE/Pong-v5", "n_envs": 8,
                  "overrides": lambda f: ["env.num_envs=8", f"agent.net.lr_scheduler_spec.frame={f}"]},
    # rl-zoo's SAC on MuJoCo (sac.yml Hopper-v5: SB3's defaults, lr 3e-4, batch 256, 256-256) on sac_pendulum's
    # spec; learning starts after 1,000 frames (zoo: 10,000) so that a short budget times mostly training
    "sac_hopper": {"file": "pendulum.json", "name": "sac_pendulum", "frames": 3_000, "env": "Hopper-v5",
                   "n_envs": 1, "overrides": lambda f: [
                       "env.name=Hopper-v5", "env.num_envs=1", "env.max_t=null", "agent.algorithm.training_iter=1",
                       "agent.algorithm.training_frequency=1", "agent.algorithm.training_start_step=1000",
                       "agent.memory.batch_size=256", "agent.memory.max_size=1000000",
                       'agent.net.optim_spec={"name": "Adam", "lr": 0.0003}', "agent.net.hid_layers=[256, 256]",
                       "agent.net.polyak_coef=0.005", "meta.eval_frequency=1000000"]},
}


def ours_spec(algo: str, frames: int) -> dict[str, Any]:
    """The benchmark spec of ``algo`` with rl-zoo's settings and a budget of ``frames``."""
    zoo = ZOO[algo]
    return load_spec(str(SPECS / zoo["file"]), zoo["name"], [f"env.max_frame={frames}", *zoo["overrides"](frames)])


def run_ours(algo: str, frames: int, seed: int, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One timed ``Session.run_rl`` of ``ours_spec`` (plus ``extra`` overrides, e.g. the bf16 variant)."""
    spec = ours_spec(algo, frames)
    if extra:
        from orchestrator.spec.load import apply_overrides, check
        spec = check(apply_overrides(spec, list(extra)))
    session = Session(spec, seed)
    w0, c0 = time.perf_counter(), time.process_time()
    session.run_rl()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    frame, opt_steps = session.clock.frame, session.clock.opt_step
    final_ma = session.train_rows[-1]["total_reward_ma"]
    session.close()
    return {"frames": frame, "opt_steps": opt_steps, "wall_s": wall, "cpu_s": cpu, "fps": frame / wall,
            "frames_per_cpu_s": frame / cpu, "final_ma": final_ma, "vectorization": vectorization_of(spec)}


def vectorization_of(spec: dict[str, Any]) -> str:
    """The session's ``env.vectorization`` as it runs (``auto`` resolved) and, for EnvPool, its threads."""
    from envs.make import resolve_vec
    from orchestrator.spec.load import build

    run = build(spec)
    cpus = float(run.meta.resources.get("num_cpus", 1))
    vec = resolve_vec(run.env, cpus).vectorization
    return f"envpool/{min(run.env.num_envs, max(1, int(cpus)))}t" if vec == "envpool" else vec


def run_ours_tracked(algo: str, frames: int, seed: int) -> dict[str, Any]:
    """``ppo_cartpole`` through ``SessionRunner``: checkpoints and TensorBoard on, as in a session actor."""
    import tempfile

    from orchestrator.session.runner import SessionRunner

    with tempfile.TemporaryDirectory() as tmp:
        spec = ours_spec(algo, frames)
        assert spec["meta"].get("tensorboard", True), "TensorBoard is off in the spec"
        runner = SessionRunner(spec, f"{tmp}/{spec['name']}_2026_01_01_000000", 0, 0, seed, resume=False)
        w0, c0 = time.perf_counter(), time.process_time()  # built before the timer, as ours and SB3
        kinds = [event.kind for event in runner.events()]
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        clock = runner.session.clock
        events = list(Path(tmp).rglob("events.out.tfevents.*"))
        assert events, "no TensorBoard event file written"
        final_ma = runner.session.train_rows[-1]["total_reward_ma"]
    return {"frames": clock.frame, "opt_steps": clock.opt_step, "wall_s": wall, "cpu_s": cpu,
            "fps": clock.frame / wall, "frames_per_cpu_s": clock.frame / cpu, "final_ma": final_ma,
            "checkpoints": kinds.count("checkpoint"), "tensorboard_files": len(events)}


def run_sb3(algo: str, frames: int, seed: int, algo_ftz: bool = False, device: str = "cpu") -> dict[str, Any]:
    """SB3's PPO, DQN or SAC with rl-zoo's settings (as ``ZOO``) on ``device`` (``cpu`` or ``cuda``),
    ``learn(frames)`` timed; CPU denormals flushed to zero only with ``algo_ftz`` (our sessions always flush them,
    see ``session.seed_globals``)."""
    import stable_baselines3 as sb3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    def lin(v: float):
        return lambda progress_remaining: progress_remaining * v

    returns: list[float] = []

    class EpisodeReturns(BaseCallback):
        def _on_step(self) -> bool:
            returns.extend(i["episode"]["r"] for i in self.locals["infos"] if "episode" in i)
            return True

    torch.set_flush_denormal(algo_ftz)  # SB3 as its users run it (denormals on), unless --sb3-ftz
    zoo = ZOO[algo]
    if algo == "ppo_atari":  # AtariWrapper (noop 30, skip 4 + max-pool, life loss, reward clip, 84x84) as ours
        import ale_py
        import gymnasium as gym
        from stable_baselines3.common.env_util import make_atari_env

        gym.register_envs(ale_py)  # the ALE/ ids (in a process of its own, nothing of ours registered them)
        from stable_baselines3.common.vec_env import VecFrameStack
        env = VecFrameStack(make_atari_env(zoo["env"], n_envs=zoo["n_envs"], seed=seed,
                                           env_kwargs={"frameskip": 1, "repeat_action_probability": 0.25}), 4)
    else:
        env = make_vec_env(zoo["env"], n_envs=zoo["n_envs"], seed=seed)  # DummyVecEnv + Monitor
    common = {"seed": seed, "device": device, "verbose": 0}
    if algo == "ppo_atari":
        model = sb3.PPO("CnnPolicy", env, n_steps=128, batch_size=256, n_epochs=4, gae_lambda=0.95, gamma=0.99,
                        learning_rate=lin(2.5e-4), clip_range=0.1, clip_range_vf=0.1, ent_coef=0.01, vf_coef=0.5,
                        max_grad_norm=0.5, policy_kwargs={"optimizer_class": torch.optim.AdamW,
                                                          "optimizer_kwargs": {"eps": 1e-5}}, **common)
    elif algo == "ppo":
        model = sb3.PPO("MlpPolicy", env, n_steps=32, batch_size=256, n_epochs=20, gae_lambda=0.8, gamma=0.98,
                        learning_rate=lin(1e-3), clip_range=lin(0.2), ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
                        policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}}, **common)
    elif algo == "dqn":
        model = sb3.DQN("MlpPolicy", env, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                        learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
                        gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04,
                        max_grad_norm=10, policy_kwargs={"net_arch": [256, 256]}, **common)
    elif algo == "sac_hopper":
        model = sb3.SAC("MlpPolicy", env, learning_rate=3e-4, buffer_size=1_000_000, learning_starts=1000,
                        batch_size=256, tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1,
                        policy_kwargs={"net_arch": [256, 256]}, **common)
    else:
        model = sb3.SAC("MlpPolicy", env, learning_rate=1e-3, buffer_size=1_000_000, learning_starts=100,
                        batch_size=256, tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1,
                        policy_kwargs={"net_arch": [256, 256]}, **common)
    w0, c0 = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=frames, callback=EpisodeReturns())
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    frame = model.num_timesteps
    env.close()
    if algo.startswith("ppo"):
        opt_steps = model._n_updates * (model.n_steps * model.n_envs // model.batch_size)  # epochs x minibatches
    else:
        opt_steps = model._n_updates
    return {"frames": frame, "opt_steps": opt_steps, "wall_s": wall, "cpu_s": cpu, "fps": frame / wall,
            "frames_per_cpu_s": frame / cpu,
            "final_ma": statistics.fmean(returns[-20:]) if returns else float("nan")}


IMPLS = ("ours", "sb3", "ours+tb", "sb3+ftz", "sb3+malloc", "ours+bf16", "ours+envpool")
VEC_ITEMS: list[str] = []  # --vectorization / --num-cpus overrides of "ours" (main sets them)


def impls_of_a_round(args: argparse.Namespace) -> list[str]:
    """Names of the timed runs of one round (``IMPLS``): ours and SB3, then the optional variants."""
    return (["ours", "sb3"] + ["ours+tb"] * args.tracking + ["sb3+ftz"] * args.sb3_ftz
            + ["sb3+malloc"] * args.sb3_malloc + ["ours+bf16"] * args.bf16 + ["ours+envpool"] * args.envpool)


def run_impl(impl: str, algo: str, frames: int, seed: int, device: str = "cpu",
             vec_items: tuple[str, ...] = ()) -> dict[str, Any]:
    """One timed run of ``impl`` (a name of ``IMPLS``) on one torch thread; see the module docstring.
    ``vec_items``: ``env.vectorization`` / ``meta.resources.num_cpus`` overrides of ours."""
    torch.set_num_threads(1)
    gpu = ("agent.net.gpu=true",) if device == "cuda" else ()
    if impl == "ours":
        return run_ours(algo, frames, seed, extra=(*gpu, *vec_items))
    if impl == "ours+envpool":
        cpus = [x for x in vec_items if x.startswith("meta.resources.num_cpus=")]
        return run_ours(algo, frames, seed, extra=(*gpu, *cpus, "env.vectorization=envpool"))
    if impl == "ours+bf16":
        return run_ours(algo, frames, seed, extra=(*gpu, "agent.net.precision=bfloat16"))
    if impl == "ours+tb":
        importlib.import_module("torch.utils.tensorboard")  # its import (about 1 s) is start-up, not training
        return run_ours_tracked(algo, frames, seed)
    if impl == "sb3+malloc":  # SB3 in a process given the allocator setting our sessions make
        from orchestrator.runtime.allocator import retain_freed_memory
        retain_freed_memory()
    return run_sb3(algo, frames, seed, algo_ftz=impl == "sb3+ftz", device=device)


def in_fresh_process(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a fresh spawned process (``fn`` a module-level function, its result picklable); returns
    its result, raises what it raised."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def run_isolated(impl: str, algo: str, frames: int, seed: int, device: str = "cpu",
                 vec_items: tuple[str, ...] = ()) -> dict[str, Any]:
    """``run_impl`` in a fresh spawned process (start-up and imports not timed), its record returned."""
    return in_fresh_process(run_impl, impl, algo, frames, seed, device, vec_items)


def main(argv: list[str] | None = None) -> int:
    """The command line (usage in the module docstring): runs the benchmark, writes its results; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algo", choices=sorted(ZOO), default="ppo")
    ap.add_argument("--frames", type=int, default=None,
                    help="frame budget per run (default: ppo 51,200, a multiple of 256; dqn 50,000; sac 10,000)")
    ap.add_argument("--rounds", type=int, default=2, help="(ours, SB3) pairs, alternating")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sb3-ftz", action="store_true",
                    help="also time SB3 with CPU denormals flushed to zero, as our sessions run (sb3+ftz)")
    ap.add_argument("--sb3-malloc", action="store_true",
                    help="also time SB3 with glibc's malloc set as our sessions set it (sb3+malloc, "
                         "orchestrator.runtime.allocator)")
    ap.add_argument("--tracking", action="store_true",
                    help="also time ours through SessionRunner with checkpoints and TensorBoard on")
    ap.add_argument("--bf16", action="store_true",
                    help="also time ours with agent.net.precision=bfloat16 (conv nets: ours+bf16)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where both put their nets (cuda: ours with agent.net.gpu true, SB3 with device cuda)")
    ap.add_argument("--vectorization", choices=("spec", "sync", "async", "auto", "envpool"), default="spec",
                    help="env.vectorization of ours (spec: the spec's own; the table's vectorization column)")
    ap.add_argument("--num-cpus", type=float, default=None,
                    help="meta.resources.num_cpus of ours (EnvPool's threads; auto turns async above 1)")
    ap.add_argument("--envpool", action="store_true",
                    help="also time ours with env.vectorization envpool (ours+envpool)")
    ap.add_argument("--same-process", action="store_true",
                    help="run every timed run in this process (default: each in a fresh process)")
    ap.add_argument("--out", default=None, help="default bench/results/throughput.json (ppo), "
                                                 "throughput_{algo}.json (others)")
    args = ap.parse_args(argv)
    args.frames = args.frames or ZOO[args.algo]["frames"]
    args.out = args.out or str(ROOT / "bench/results" / ("throughput.json" if args.algo == "ppo"
                                                          else f"throughput_{args.algo}.json"))
    rollout = {"ppo": 8 * 32, "ppo_atari": 8 * 128}.get(args.algo)  # PPO: whole rollouts (envs x steps) only
    problem = "--tracking times the CPU session actor path only; drop it with --device cuda" \
        if args.tracking and args.device == "cuda" else \
        f"--frames must be a multiple of {rollout} (one {args.algo} rollout)" if rollout and args.frames % rollout \
        else None
    if problem:
        ap.error(problem)

    import stable_baselines3
    torch.set_num_threads(1)
    run = run_impl if args.same_process else run_isolated
    vec_items = tuple(([] if args.vectorization == "spec" else [f"env.vectorization={args.vectorization}"])
                      + ([] if args.num_cpus is None else [f"meta.resources.num_cpus={args.num_cpus}"]))
    runs = []
    for r in range(args.rounds):
        for name in impls_of_a_round(args):
            load = os.getloadavg()
            rec = run(name, args.algo, args.frames, args.seed, args.device, vec_items)
            rec.update(impl=name, round=r, load_start=load, load_end=os.getloadavg())
            runs.append(rec)
            print(f"round {r} {name:4s}: {rec['frames']} frames in {rec['wall_s']:.1f} s = "
                  f"{rec['fps']:,.0f} fps ({rec['frames_per_cpu_s']:,.0f} frames/CPU-s), "
                  f"final ma-20 {rec['final_ma']:.1f}, "
                  f"load1 {load[0]:.2f}", flush=True)

    def med(impl: str, key: str) -> float:
        return statistics.median(x[key] for x in runs if x["impl"] == impl)

    summary = {k: {"ours": med("ours", k), "sb3": med("sb3", k), "ratio": med("ours", k) / med("sb3", k)}
               for k in ("fps", "frames_per_cpu_s")}
    for extra in [x for x in IMPLS[2:] if any(r["impl"] == x for r in runs)]:
        for k in ("fps", "frames_per_cpu_s"):
            summary[k].update({extra: med(extra, k), f"ratio_ours/{extra}" if extra.startswith("sb3")
                               else f"ratio_{extra}/sb3": (med("ours", k) / med(extra, k)) if extra.startswith("sb3")
                               else med(extra, k) / med("sb3", k)})
    out = {"algo": args.algo, "spec": ZOO[args.algo]["name"], "frames": args.frames, "rounds": args.rounds,
           "seed": args.seed, "torch_threads": 1, "device": args.device,
           "process_per_run": not args.same_process,
           "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
           "versions": {"torch": torch.__version__, "stable_baselines3": stable_baselines3.__version__},
           "cpu_count": os.cpu_count(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "summary": summary, "runs": runs}
    storage.write_text(str(args.out), json.dumps(out, indent=1) + "\n")
    vecs = {impl: next((x.get("vectorization", "-") for x in runs if x["impl"] == impl), "-") for impl in IMPLS}
    vecs["sb3"] = vecs["sb3+ftz"] = vecs["sb3+malloc"] = "SB3 DummyVecEnv"
    print("\n| impl | vectorization | fps (median) | frames / CPU-s (median) |\n|---|---|---|---|")
    for impl in [x for x in IMPLS if x in summary["fps"]]:
        print(f"| {impl} | {vecs[impl]} | {summary['fps'][impl]:,.0f} | {summary['frames_per_cpu_s'][impl]:,.0f} |")
    print(f"\nratio ours/SB3: fps {summary['fps']['ratio']:.2f}x, frames/CPU-s "
          f"{summary['frames_per_cpu_s']['ratio']:.2f}x")
    for key in [k for k in summary["fps"] if k.startswith("ratio_")]:
        print(f"{key}: fps {summary['fps'][key]:.2f}x, frames/CPU-s {summary['frames_per_cpu_s'][key]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
