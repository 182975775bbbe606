"""PBT's decisions without Ray: seeded ranking with ties drawn, no exploit without a strictly better donor, failed
trials replaced first, explored values fitted to the schema and the distribution and checked by the full spec check
before they are recorded, integer steps, the record's fields, and the PBT spec checks (intervals, resume edits, the
README's and docs' examples as written)."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from orchestrator.errors import SpecError
from orchestrator.search.decision import Decision
from orchestrator.search.pbt_policy import (
    MAX_REDRAWS,
    RESEED_RANGE,
    VERSION,
    PopulationFailed,
    decide,
    explore_key,
    fit,
    format_exploit,
    initial_config,
    lineage,
    perturb,
    quantile_size,
    rank,
    reseed,
    sample,
)
from orchestrator.spec.load import check, load_spec
from orchestrator.spec.pbt import KeyRange, PBTSettings, key_range
from orchestrator.spec.resume import resume_spec
from orchestrator.spec.search_space import SearchVar, apply_values, parse_search
from orchestrator.store.predir import spec_file

REPO = Path(__file__).resolve().parents[3]
SPECS = str(REPO / "specs/benchmark/cartpole.json")
LR, GAMMA = "agent.net.optim_spec.lr", "agent.algorithm.gamma"
STAY = PBTSettings(400, resample_probability=0.0)  # always perturb


def pbt_spec(search: dict, interval: int = 8192, extra: tuple = ()) -> dict:
    """ppo_cartpole (log_frequency 2048, num_envs 8) as a 4-trial PBT search of ``search``."""
    return load_spec(SPECS, "ppo_cartpole", ["meta.max_trial=4", f"search={json.dumps(search)}",
                                             'meta.search_scheduler={"name": "PBT", "perturbation_interval": '
                                             f'{interval}}}', *extra])


def spec_check(spec: dict):
    """The full spec check of a config (``Population.config_problems``)."""
    def problems(config: dict) -> list[str]:
        try:
            check(apply_values(spec, config))
            return []
        except SpecError as err:
            return err.problems
    return problems


# ---------------------------------------------------------------- ranking and donors
def test_decisions_are_seeded_ranked_by_score_and_exploit_the_top_quantile():
    lr = SearchVar(LR, "loguniform", [1e-4, 1e-2])
    gamma = SearchVar(GAMMA, "choice", [0.9, 0.95, 0.99])
    settings = PBTSettings(400, quantile_fraction=0.25, resample_probability=0.0, perturbation_factors=(0.8, 1.2))
    configs = {t: {LR: 1e-3 * (t + 1), GAMMA: 0.95} for t in range(8)}
    scores = {0: 5.0, 1: 50.0, 2: 40.0, 3: math.nan, 4: 30.0, 5: 20.0, 6: 10.0, 7: 45.0}
    a = decide(3, 1200, scores, configs, [lr, gamma], settings, seed=7)
    assert a == decide(3, 1200, scores, configs, [lr, gamma], settings, seed=7)
    assert quantile_size(8, 0.25) == 2 and quantile_size(3, 0.5) == 1
    exploited = {r.trial: r for r in a if r.donor is not None}
    assert set(exploited) == {0, 6}  # the two lowest scores; the NaN one (no score) is neither donor nor recipient
    for r in exploited.values():
        assert r.donor in (1, 7) and r.donor_score == scores[r.donor]
        donor_lr = configs[r.donor][LR]
        assert r.config[LR] in (pytest.approx(donor_lr * 0.8), pytest.approx(donor_lr * 1.2))
        assert r.config[GAMMA] in (0.9, 0.99)  # a neighbour of 0.95
        assert r.explore[LR]["op"] == "perturb" and r.explore[LR]["before"] == donor_lr
        assert r.explore[LR]["after"] == r.config[LR] == donor_lr * r.explore[LR]["factor"]
        assert r.explore[GAMMA] == {"op": "shift", "before": 0.95, "after": r.config[GAMMA], "clamped": False}
        assert r.reseed == reseed(7, r.trial, 3) and r.redraws == []
    kept = [r for r in a if r.donor is None]
    assert all(r.config == configs[r.trial] and r.explore is None and r.reseed is None for r in kept)
    assert [r.trial for r in a] == list(range(8)) and all(r.generation == 3 and r.frame == 1200 for r in a)
    assert {r.version for r in a} == {VERSION} and [r.rank for r in a] == [7, 1, 3, 8, 4, 5, 6, 2]
    assert a[3].score is None  # NaN recorded as null
    other = [decide(3, 1200, scores, configs, [lr, gamma], settings, seed=s) for s in range(8, 20)]
    assert any(o != a for o in other), "the seed does not reach the decisions"


def test_no_score_is_no_donor_and_no_recipient():
    lr = SearchVar(LR, "loguniform", [1e-4, 1e-2])
    configs = {t: {LR: 1e-3 * (t + 1)} for t in range(4)}
    for seed in range(10):  # no episode ended yet: no information, no exploit
        records = decide(1, 400, {t: None for t in range(4)}, configs, [lr], STAY, seed)
        assert all(r.donor is None for r in records)
        records = decide(1, 400, {0: None, 1: 10.0, 2: 5.0, 3: math.nan}, configs, [lr], STAY, seed)
        assert [(r.trial, r.donor) for r in records if r.donor is not None] == [(2, 1)]


def test_ties_are_drawn_not_taken_by_index_and_equal_scores_never_exploit():
    lr = SearchVar(LR, "loguniform", [1e-4, 1e-2])
    configs = {t: {LR: 1e-3} for t in range(4)}
    for seed in range(10):  # CartPole at 500 everywhere: nobody is better
        assert all(r.donor is None for r in decide(1, 400, {t: 500.0 for t in range(4)}, configs, [lr], STAY, seed))
    pairs = {(r.trial, r.donor) for seed in range(40)
             for r in decide(2, 800, {0: 500.0, 1: 500.0, 2: 100.0, 3: 100.0}, configs, [lr], STAY, seed)
             if r.donor is not None}
    assert pairs == {(2, 0), (2, 1), (3, 0), (3, 1)}  # each tied top trial donates, each tied bottom one receives
    orders = {tuple(rank({t: 1.0 for t in range(5)}, range(5), (), np.random.default_rng(s))) for s in range(20)}
    assert len(orders) > 5
    # exactly one exploit per generation at quantile 0.25 of 4, never of a tie
    for seed in range(20):
        (r,) = [r for r in decide(1, 400, {0: 9.0, 1: 9.0, 2: 9.0, 3: 1.0}, configs, [lr], STAY, seed)
                if r.donor is not None]
        assert r.trial == 3 and r.donor in (0, 1, 2)


def test_a_failed_trial_ranks_last_and_is_replaced_first():
    lr = SearchVar(LR, "loguniform", [1e-4, 1e-2])
    configs = {t: {LR: 1e-3 * (t + 1)} for t in range(8)}
    scores = {t: float(10 * t) for t in range(8)}  # t7 best; t0, t1 lowest
    records = decide(2, 800, scores, configs, [lr], STAY, 3, failed={5})
    got = {r.trial: r for r in records if r.donor is not None}
    assert set(got) == {5, 0}  # the failed trial, then the lowest of quantile 2
    assert got[5].failed and got[5].rank == 8 and got[5].donor in (7, 6)
    # more failed trials than the quantile: all replaced, none by a failed trial
    records = decide(2, 800, scores, configs, [lr], STAY, 3, failed={1, 5, 6})
    got = {r.trial: r.donor for r in records if r.donor is not None}
    assert set(got) == {1, 5, 6} and set(got.values()) <= {7, 4}
    # no score anywhere yet: a healthy trial's state replaces a failed one
    records = decide(1, 400, {t: None for t in range(8)}, configs, [lr], STAY, 3, failed={2})
    assert [(r.trial, r.donor is not None and r.donor != 2) for r in records if r.donor is not None] == \
        [(2, True)]
    with pytest.raises(PopulationFailed, match=r"every trial of the population failed \(t0, t1, t2, t3, t4"):
        decide(1, 400, scores, configs, [lr], STAY, 3, failed=set(range(8)))


# ---------------------------------------------------------------- explore: ranges, grids, integers
def test_perturb_clamps_to_the_distribution_and_resamples_within_it():
    rng = np.random.default_rng(0)
    var = SearchVar(GAMMA, "uniform", [0.9, 0.999])
    up = PBTSettings(400, resample_probability=0.0, perturbation_factors=(1.2,))
    assert perturb(var, 0.99, up, rng) == 0.999
    ints = SearchVar("agent.algorithm.training_epoch", "randint", [1, 20])
    assert perturb(ints, 5, PBTSettings(400, resample_probability=0.0, perturbation_factors=(1.5,)), rng) == 8
    always = PBTSettings(400, resample_probability=1.0)
    draws = [perturb(SearchVar(LR, "loguniform", [1e-4, 1e-2]), 5.0, always, rng) for _ in range(50)]
    assert all(1e-4 <= d < 1e-2 for d in draws)
    assert initial_config([var], 3, 1) == initial_config([var], 3, 1) != initial_config([var], 3, 2)


def test_a_normal_key_perturbed_out_of_the_schema_is_clamped_and_passes_the_spec_check():
    spec = pbt_spec({"agent.algorithm.gamma__normal": [0.99, 0.1]})
    (var,), problems = parse_search(spec)[0], spec_check(spec)
    ranges = {GAMMA: key_range(spec, GAMMA)}
    assert ranges[GAMMA] == KeyRange(0.0, 1.0)
    assert problems({GAMMA: 1.187}) == ["agent.algorithm.gamma: must be <= 1, got 1.187"]  # what the check says
    value, record = explore_key(var, 0.989, PBTSettings(400, 0.25, 0.0, (1.2,)), np.random.default_rng(0),
                                ranges[GAMMA])
    assert value == 1.0 and record == {"op": "perturb", "factor": 1.2, "before": 0.989, "after": 1.0, "clamped": True}
    configs = {t: {GAMMA: 0.989 + 0.001 * t} for t in range(4)}
    settings = PBTSettings(8192, 0.25, 0.0, (1.2,))
    for seed in range(5):
        records = decide(1, 8192, {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}, configs, [var], settings, seed,
                         ranges=ranges, problems=problems)
        (r,) = [r for r in records if r.donor is not None]
        assert r.trial == 0 and r.config == {GAMMA: 1.0} and r.explore[GAMMA]["clamped"]
        assert all(problems(x.config) == [] for x in records)  # every recorded decision applies
    # the initial samples too: N(0.99, 0.1) gives values above 1 for some trials
    initial = [initial_config([var], s, t, ranges, problems)[GAMMA] for s in range(4) for t in range(4)]
    assert max(initial) == 1.0 and all(0 <= g <= 1 for g in initial)


def test_a_config_the_spec_check_refuses_is_drawn_again_or_the_donor_values_kept():
    lr = SearchVar(LR, "loguniform", [1e-4, 1e-2])
    gamma = SearchVar(GAMMA, "uniform", [0.5, 0.99])
    configs = {0: {LR: 1e-3, GAMMA: 0.9}, 1: {LR: 2e-3, GAMMA: 0.8}}
    scores = {0: 1.0, 1: 2.0}

    def small_lr(config):  # a rule across keys the ranges cannot express
        return [f"{LR}: above 1e-3 with gamma {config[GAMMA]}"] if config[LR] > 1e-3 else []

    settings = PBTSettings(400, 0.5, 0.0, (1.2,))
    (r,) = [r for r in decide(1, 400, scores, configs, [lr, gamma], settings, 4, problems=small_lr) if r.donor]
    assert r.redraws[0] == [f"{LR}: above 1e-3 with gamma {0.8 * 1.2}"]  # 2.4e-3 refused
    assert r.explore[LR]["op"] == "redraw" and r.config[LR] <= 1e-3 and small_lr(r.config) == []
    assert r.explore[GAMMA] == {"op": "perturb", "factor": 1.2, "before": 0.8, "after": 0.96, "clamped": False}
    assert r == [x for x in decide(1, 400, scores, configs, [lr, gamma], settings, 4, problems=small_lr)
                 if x.donor][0]  # the redraws come from the seeded stream

    def never(config):
        return [f"{LR}: refused"] if config != configs[1] else []

    (r,) = [r for r in decide(1, 400, scores, configs, [lr, gamma], settings, 4, problems=never) if r.donor]
    assert r.config == configs[1] and len(r.redraws) == MAX_REDRAWS + 1
    assert {e["op"] for e in r.explore.values()} == {"kept"}


def test_integer_perturbations_move_at_least_one_step_and_exclusive_bounds_hold():
    down, up = PBTSettings(400, 0.25, 0.0, (0.8,)), PBTSettings(400, 0.25, 0.0, (1.2,))
    rng = np.random.default_rng(0)
    ints = SearchVar("agent.algorithm.training_epoch", "randint", [1, 5])  # 1..4
    assert [perturb(ints, v, up, rng) for v in (1, 2, 3, 4)] == [2, 3, 4, 4]
    assert [perturb(ints, v, down, rng) for v in (1, 2, 3, 4)] == [1, 1, 2, 3]
    assert explore_key(ints, 4, up, rng)[1]["clamped"]
    assert max(sample(ints, rng) for _ in range(300)) == 4
    assert max(perturb(ints, 4, PBTSettings(400, 0.25, 1.0), rng) for _ in range(300)) == 4  # resampled
    pb2 = PBTSettings(400, 0.5, method="PB2")  # PB2's picks are fitted too: never randint's high
    picks = [r.config["agent.algorithm.training_epoch"] for seed in range(30)
             for r in decide(1, 400, {0: 1.0, 1: 2.0}, {0: {ints.path: 1}, 1: {ints.path: 2}}, [ints], pb2, seed)
             if r.donor is not None]
    assert set(picks) == {1, 2, 3, 4}
    log = SearchVar("agent.algorithm.training_epoch", "lograndint", [1, 8])
    assert perturb(log, 7, up, rng) == 7 and perturb(log, 1, up, rng) == 2
    grid = SearchVar("agent.algorithm.training_epoch", "qrandint", [4, 20, 4])
    assert [perturb(grid, v, up, rng) for v in (4, 8, 16, 20)] == [8, 12, 20, 20]
    assert [perturb(grid, v, down, rng) for v in (4, 8, 20)] == [4, 4, 16]
    q = SearchVar(GAMMA, "quniform", [0.8, 0.99, 0.05])  # grid 0.8, 0.85, 0.9, 0.95 (0.99 is off the grid)
    for v in (0.8, 0.85, 0.9, 0.95):
        for s in (up, down, PBTSettings(400, 0.25, 1.0)):
            out = perturb(q, v, s, rng)
            assert 0.8 <= out < 0.96 and abs(out / 0.05 - round(out / 0.05)) < 1e-9, (v, out)
    # a schema's open bound (alpha_lr > 0): the next grid point inside it, or the next float
    assert fit(SearchVar("agent.algorithm.alpha_lr", "qrandn", [2, 3, 0.5]), -1.7, KeyRange(0, 10, True)) == (0.5, True)
    assert fit(SearchVar("agent.algorithm.alpha_lr", "normal", [2, 3]), -1.7, KeyRange(0, 10, True))[0] == 1e-9


# ---------------------------------------------------------------- the record
def test_reseed_and_records_of_older_versions():
    values = {reseed(1, t, g) for t in range(5) for g in range(1, 5)}
    assert len(values) == 20 and all(0 <= v < RESEED_RANGE for v in values)
    assert reseed(1, 2, 3) == reseed(1, 2, 3) != reseed(2, 2, 3)
    old = {"generation": 2, "frame": 800, "trial": 1, "donor": 0, "score": 3.0, "donor_score": 9.5,
           "config": {LR: 0.0012, GAMMA: 0.95}}  # a pbt.jsonl line written before version 2
    assert format_exploit(Decision.from_json(old)) == (
        "PBT generation 2 (frame 800): t1 (score 3) continues from t0 (score 9.5) with lr=0.0012, gamma=0.95")
    new = {**old, "failed": True, "explore": {
        GAMMA: {"op": "perturb", "factor": 1.2, "before": 0.95, "after": 1.0, "clamped": True},
        LR: {"op": "resample", "before": 0.001, "after": 0.0012, "clamped": False}}}
    assert format_exploit(Decision.from_json(new), "PB2") == (
        "PB2 generation 2 (frame 800): t1 (failed) continues from t0 (score 9.5) "
        "with gamma 0.95 -> 1 (x1.2, clamped), lr 0.001 -> 0.0012 (resample)")


def test_lineage_follows_donors_backwards():
    initial = {0: {"x": 0}, 1: {"x": 1}, 2: {"x": 2}}
    records = [  # generation 1: t2 takes t0's state; generation 2: t1 takes t2's state (older records: no reseed)
        {"generation": 1, "trial": 0, "donor": None, "config": {"x": 0}},
        {"generation": 1, "trial": 1, "donor": None, "config": {"x": 1}},
        {"generation": 1, "trial": 2, "donor": 0, "config": {"x": 20}, "reseed": 77},
        {"generation": 2, "trial": 0, "donor": None, "config": {"x": 0}},
        {"generation": 2, "trial": 1, "donor": 2, "config": {"x": 21}},
        {"generation": 2, "trial": 2, "donor": None, "config": {"x": 20}},
    ]
    records = [Decision.from_json({"frame": 400 * r["generation"], "score": None, "donor_score": None, **r})
               for r in records]
    assert lineage(records, 1, initial, 3) == [{"generation": 1, "trial": 0, "config": {"x": 0}, "reseed": None},
                                               {"generation": 2, "trial": 2, "config": {"x": 20}, "reseed": 77},
                                               {"generation": 3, "trial": 1, "config": {"x": 21}, "reseed": None}]
    assert [s["trial"] for s in lineage(records, 0, initial, 3)] == [0, 0, 0]


# ---------------------------------------------------------------- spec checks
def test_interval_checks_name_the_nearest_valid_values_and_refuse_a_run_without_decisions():
    with pytest.raises(SpecError) as err:
        pbt_spec({f"{LR}__loguniform": [1e-4, 1e-2]}, 10000)
    assert ("meta.search_scheduler.perturbation_interval: 10000 is not a multiple of meta.log_frequency=2048 "
            "(generations end on a log row and a checkpoint); the nearest valid values are 8192 and 10240") \
        in err.value.problems
    with pytest.raises(SpecError) as err:
        pbt_spec({f"{LR}__loguniform": [1e-4, 1e-2]}, 100352)
    assert err.value.problems == [
        "meta.search_scheduler.perturbation_interval: 100352 is not below env.max_frame=100000: the population would "
        "train without a single decision; use an interval below it (e.g. 98304)"]
    with pytest.raises(SpecError) as err:  # an interval equal to max_frame: one generation, no decision either
        pbt_spec({f"{LR}__loguniform": [1e-4, 1e-2]}, 8192, ("env.max_frame=8192",))
    assert err.value.problems == [
        "meta.search_scheduler.perturbation_interval: 8192 is not below env.max_frame=8192: the population would "
        "train without a single decision; use an interval below it (e.g. 6144)"]
    pbt_spec({f"{LR}__loguniform": [1e-4, 1e-2]}, 6144, ("env.max_frame=8192",))  # one below it: valid
    with pytest.raises(SpecError) as err:  # num_envs 8 and log_frequency 200: multiples of 200
        pbt_spec({f"{LR}__loguniform": [1e-4, 1e-2]}, 300, ("meta.log_frequency=200",))
    assert "300 is not a multiple of meta.log_frequency=200 and env.num_envs=8" in err.value.problems[0]
    assert err.value.problems[0].endswith("the nearest valid values are 200 and 400")


def test_search_ranges_the_schema_refuses_are_spec_errors():
    with pytest.raises(SpecError) as err:
        pbt_spec({f"{GAMMA}__uniform": [1.1, 1.2], "agent.algorithm.training_epoch__uniform": [1, 3],
                  "agent.algorithm.lam__choice": [0.9, 1.5]})
    assert err.value.problems == [
        "search.agent.algorithm.gamma__uniform: [1.1, 1.2] lies outside the values agent.algorithm.gamma takes "
        "(>= 0 and <= 1)",
        "search.agent.algorithm.training_epoch__uniform: agent.algorithm.training_epoch is an int; use randint, "
        "qrandint, lograndint, qlograndint or choice",
        "search.agent.algorithm.lam__choice: the values [1.5] lie outside the values agent.algorithm.lam takes "
        "(>= 0 and <= 1)"]
    spec = pbt_spec({f"{GAMMA}__uniform": [0.9, 1.2], f"{LR}__normal": [1e-3, 1e-2]})
    assert key_range(spec, LR) == KeyRange(0.0, 10.0)
    assert key_range(spec, "agent.algorithm.training_epoch") == KeyRange(0.0, 10000.0, True, False, True)


def test_a_pbt_resume_refuses_population_edits_by_name(tmp_path):
    spec = pbt_spec({f"{LR}__loguniform": [1e-4, 1e-2]})
    (tmp_path / Path(spec_file(str(tmp_path), spec["name"])).name).write_text(json.dumps(spec))
    for key, value in (("meta.max_session", 6), ("env.max_frame", 200000), ("meta.max_trial", 6)):
        section, leaf = key.split(".")
        new = {**spec, section: {**spec[section], leaf: value}}
        with pytest.raises(SpecError) as err:
            resume_spec(str(tmp_path), new)
        assert any(p.startswith(f"{key}: the run was saved with") for p in err.value.problems), err.value.problems
    with pytest.raises(SpecError, match=r"search.agent.net.optim_spec.lr__loguniform: the run was saved with"):
        resume_spec(str(tmp_path), {**spec, "search": {f"{LR}__loguniform": [1e-5, 1e-2]}})
    with pytest.raises(SpecError, match=r"meta.max_session: .* \(a PBT population keeps it"):
        resume_spec(str(tmp_path), {**spec, "meta": {**spec["meta"], "max_session": 6}})
    plain_spec = load_spec(SPECS, "ppo_cartpole", ["meta.max_session=2"])  # a train@ may raise it
    (tmp_path / Path(spec_file(str(tmp_path), spec["name"])).name).write_text(json.dumps(plain_spec))
    assert resume_spec(str(tmp_path), {**plain_spec, "meta": {**plain_spec["meta"], "max_session": 4}})[1] == \
        ["meta.max_session: 2 -> 4"]


def test_every_pbt_example_of_the_readme_and_docs_passes_the_spec_check():
    readme = (REPO / "README.md").read_text()
    examples = re.findall(r"-s '(meta\.search_scheduler=\{[^']*\})'", readme)
    assert examples, "the README has a PBT example"
    tour = re.search(r"lab (specs/\S+) (\w+) search --name tour-search \\\n\s+-s '([^']+)' -s (\S+)", readme)
    for example in examples:  # added to the tour's search command, as the README says
        spec = load_spec(str(REPO / tour[1]), tour[2], [tour[3], tour[4], example])
        assert spec["meta"]["search_scheduler"]["name"] == "PBT"
    docs = (REPO / "docs/search.md").read_text()
    blocks = [b for b in re.findall(r"```json\n(.*?)```", docs, flags=re.S) if "perturbation_interval" in b]
    assert blocks
    for block in blocks:  # a fragment of the tour's spec
        fragment = json.loads("{" + block + "}")
        items = [f"search={json.dumps(fragment['search'])}"] + \
            [f"meta.{k}={json.dumps(v)}" for k, v in fragment["meta"].items()]
        assert load_spec(SPECS, "ppo_cartpole", items)["meta"]["search_scheduler"]["name"] in ("PBT", "PB2")


def test_the_population_samples_and_checks_within_the_schema(tmp_path):
    """``orchestrator.search.pbt.Population`` wires ranges and the full check into the policy: N(0.99, 0.05) gives
    gamma above 1 for some of 16 trials, which start at 1 instead of exiting 2."""
    from orchestrator.search.pbt import Population

    spec = pbt_spec({"agent.algorithm.gamma__normal": [0.99, 0.05]}, extra=("meta.max_trial=16",))
    pop = Population(str(tmp_path), spec, None, True, check)
    gammas = [c[GAMMA] for c in pop.initial.values()]
    assert max(gammas) == 1.0 and min(gammas) < 1.0
    assert pop.config_problems({GAMMA: 1.2}) == ["agent.algorithm.gamma: must be <= 1, got 1.2"]
    assert all(pop.config_problems(c) == [] for c in pop.initial.values())


def test_a_decision_line_reads_and_writes_back_as_it_was_in_either_version():
    """``Decision.from_json`` then ``to_json`` gives every ``pbt.jsonl`` line back key for key, in its order: a
    version-2 line of ``decide`` and a line written before versions (no version key, none added)."""
    lr = SearchVar(LR, "loguniform", [1e-4, 1e-2])
    records = decide(1, 400, {0: 1.0, 1: 2.0, 2: None, 3: 4.0}, {t: {LR: 1e-3} for t in range(4)}, [lr], STAY, 5)
    lines = [json.dumps(r.to_json()) for r in records]
    assert [json.dumps(Decision.from_json(json.loads(line)).to_json()) for line in lines] == lines
    assert list(json.loads(lines[0])) == ["version", "generation", "frame", "trial", "rank", "failed", "donor",
                                          "score", "donor_score", "config", "explore", "redraws", "reseed"]
    exploit = next(r for r in records if r.exploited)
    assert exploit.reseed == reseed(5, exploit.trial, 1) and exploit.explore[LR]["op"] == "perturb"
    old = '{"generation": 2, "frame": 800, "trial": 1, "donor": 0, "score": 3.0, "donor_score": 9.5, "config": {}}'
    decision = Decision.from_json(json.loads(old))
    assert decision.version is None and decision.reseed is None and decision.explore is None and decision.exploited
    assert json.dumps(decision.to_json()) == old
