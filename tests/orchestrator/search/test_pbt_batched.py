"""A PBT population whose trials run their sessions as seed groups (``meta.session_batch``): a trial never exploited
equals the uninterrupted batched run of its config, an exploited one starts its generation from the donor's
checkpoints with reseeded acting streams, and ``--pbt-replay`` reproduces it bit for bit."""

import json

import pandas as pd
from lab_helpers import SPECS, only_predir, overrides, run_cli

from orchestrator.store.checkpoint import CheckpointStore

PBT = ["meta.max_trial=2", "meta.max_session=2", "meta.session_batch=2", "env.max_frame=1600", "env.num_envs=4",
       "meta.log_frequency=200", "meta.checkpoint_frequency=200", "meta.random_seed=21", "meta.tensorboard=false",
       "agent.algorithm.time_horizon=50", "agent.algorithm.training_epoch=2",
       'meta.resources={"num_cpus": 0.5, "num_gpus": 0}',
       'search={"agent.net.optim_spec.lr__loguniform": [1e-4, 1e-1]}',
       'meta.search_scheduler={"name": "PBT", "perturbation_interval": 800, "quantile_fraction": 0.5}']
COMPARED = lambda df: df.drop(columns=["wall_t", "fps"]).reset_index(drop=True)  # noqa: E731


def test_a_batched_population_is_exact_and_replays_bit_for_bit(ray_local, tmp_path, capsys):
    import torch

    from orchestrator.session.batched import SessionGroup
    from orchestrator.spec.load import load_spec
    from orchestrator.store.predir import session_seed

    data = tmp_path / "data"
    assert run_cli(SPECS, "ppo_cartpole", "search", "--data-dir", str(data), *overrides(PBT)) == 0
    predir = only_predir(data)
    records = [json.loads(line) for line in (predir / "pbt.jsonl").read_text().splitlines()]
    exploited = {r["trial"] for r in records if r["donor"] is not None}
    assert len(exploited) == 1, records  # one decision (frame 800): the worse trial takes the better one's state
    for t in range(2):
        for s in range(2):
            manifest = CheckpointStore(str(predir / f"t{t}/s{s}")).manifest(1600)
            assert manifest.meta["batched"] == 2 and manifest.meta["batch_sessions"] == [0, 1]
            assert manifest.meta["exact"] is True

    # the trial never exploited: the uninterrupted batched run of its config (restored at every generation)
    kept = 1 - next(iter(exploited))
    lr = json.loads((predir / f"t{kept}/trial.json").read_text())["values"]["agent.net.optim_spec.lr"]
    torch.set_num_threads(1)
    spec = load_spec(SPECS, "ppo_cartpole", [*PBT[:-2], f"agent.net.optim_spec.lr={lr}"])
    group = SessionGroup(spec, [session_seed(21, kept, s) for s in range(2)], kept, [0, 1])
    group.run_rl()
    for s, session in enumerate(group.sessions):
        got = pd.read_parquet(predir / f"t{kept}/s{s}/train_df.parquet")
        pd.testing.assert_frame_equal(COMPARED(session.train_df), COMPARED(got))
        manifest = CheckpointStore(str(predir / f"t{kept}/s{s}")).manifest(1600)
        assert manifest.meta["weights_sha256"] == session.weights_sha256()

    # an exploited trial: each session's log says it continued from the donor with its streams reseeded
    t = next(iter(exploited))
    for s in range(2):
        log = (predir / f"t{t}/s{s}/log.txt").read_text()
        assert f"continues from t{kept}_s{s}'s checkpoint" in log and "acting RNG streams reseeded with" in log

    # its replay: both sessions bit for bit
    capsys.readouterr()
    replay = tmp_path / "replay"
    assert run_cli(str(predir / "ppo_cartpole_spec.json"), "ppo_cartpole", "train", "--data-dir", str(replay),
                   "--pbt-replay", str(predir), "--trial", str(t)) == 0
    assert "equal the original's" in capsys.readouterr().out
    replayed = only_predir(replay)
    for s in range(2):
        a = pd.read_parquet(replayed / f"t0/s{s}/train_df.parquet")
        b = pd.read_parquet(predir / f"t{t}/s{s}/train_df.parquet")
        pd.testing.assert_frame_equal(COMPARED(a), COMPARED(b), check_exact=True)
