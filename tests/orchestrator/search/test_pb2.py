"""PB2's Gaussian-process bandit (``orchestrator.search.pb2``) on synthetic data, without Ray: its fitted noise and
lengthscale, its UCB weight, and picks that beat uniform random on noisy, sparse score changes."""

import math

import numpy as np
import pytest

from orchestrator.search import pb2
from orchestrator.search.decision import Decision
from orchestrator.spec.search_space import SearchVar


def _datasets(dims: int, points: int, noise: float, count: int = 40):
    """``count`` data sets of ``points`` observations over 3 generations: the values uniform in the unit box, the
    score change ``1 - 4 |x - opt|^2`` plus Gaussian noise of sd ``noise``, ``opt`` uniform in [0.15, 0.85]^dims."""
    for seed in range(count):
        rng = np.random.default_rng(seed)
        opt = rng.uniform(0.15, 0.85, dims)
        data = []
        for i in range(points):
            u = rng.random(dims)
            change = 1 - 4 * float(((u - opt) ** 2).sum()) + noise * float(rng.standard_normal())
            data.append(((2 + i * 3 // points) / 10, {f"k{d}": float(u[d]) for d in range(dims)}, change))
        yield seed, opt, data


@pytest.mark.parametrize("dims, points", [(1, 16), (2, 24)])
def test_pb2_picks_are_much_closer_to_the_best_values_than_uniform_random_on_noisy_sparse_data(dims, points):
    variables = [SearchVar(f"k{d}", "uniform", [0.0, 1.0]) for d in range(dims)]
    picked, uniform = [], []
    for seed, opt, data in _datasets(dims, points, noise=0.3):
        rng = np.random.default_rng(1000 + seed)
        donors = [{v.path: float(rng.random()) for v in variables} for _ in range(2)]
        for pick in pb2.select(variables, data, 0.6, donors, rng):
            picked.append(np.linalg.norm([pick[v.path] for v in variables] - opt))
        uniform.extend(np.linalg.norm(rng.random((500, dims)) - opt, axis=1))
    # the noise-fitting GP with Ray's kappa reaches 0.45x (1-D) and 0.40x (2-D) random's mean distance; a GP with the
    # noise fixed at 0.01 and Srinivas' beta 0.88x and 0.75x
    assert np.mean(picked) < 0.6 * np.mean(uniform)


def test_pb2_fits_the_noise_and_keeps_the_lengthscale_of_the_signal():
    rng = np.random.default_rng(0)
    x = np.column_stack([np.full(120, 0.5), rng.random(120)])
    signal = np.sin(2 * np.pi * x[:, 1])  # variance 0.5
    for noise_sd, low, high in [(0.7, 0.3, 0.7), (0.01, 0.0, 0.01)]:
        y = signal + noise_sd * rng.standard_normal(120)
        y = (y - y.mean()) / y.std()
        ls, eps, s2, n2 = pb2.fit(x, y)
        assert low < n2 / (s2 + n2) < high  # true noise fraction 0.49 and 0.0002
        assert 0.1 < ls < 0.4  # sin(2 pi u): about 0.16 to 0.25 in unit coordinates, not the grid's shortest
    y = rng.standard_normal(120)  # pure noise: nearly all of it noise, and the longest lengthscale
    ls, eps, s2, n2 = pb2.fit(x, y)
    assert n2 / (s2 + n2) > 0.9


def test_pb2_ucb_weight_is_ray_tunes_kappa():
    assert pb2.kappa(1) == pytest.approx(math.sqrt(0.2))
    assert pb2.kappa(10) == pytest.approx(math.sqrt(0.2 + math.log(4)))
    assert pb2.kappa(80) == pytest.approx(1.915, abs=1e-3)


def test_pb2_picks_are_seeded_and_spread_within_a_batch():
    variables = [SearchVar("lr", "loguniform", [1e-5, 1e-2]), SearchVar("n", "randint", [1, 20])]
    _, _, data = next(_datasets(2, 24, noise=0.3))
    data = [(t, {"lr": pb2.from_unit(variables[0], v["k0"]), "n": pb2.from_unit(variables[1], v["k1"])}, y)
            for t, v, y in data]
    donors = [{"lr": 1e-3, "n": 5}] * 3
    a = pb2.select(variables, data, 0.6, donors, np.random.default_rng(7))
    assert a == pb2.select(variables, data, 0.6, donors, np.random.default_rng(7))
    assert len({(p["lr"], p["n"]) for p in a}) == 3  # a pick is believed at its mean: the next one goes elsewhere
    assert all(1e-5 <= p["lr"] <= 1e-2 and isinstance(p["n"], int) and 1 <= p["n"] <= 20 for p in a)


def test_pbt_vs_random_bench_runs_pb2_and_merges_methods_of_one_budget():
    import argparse

    from bench import pbt_vs_random as bench

    args = argparse.Namespace(trials=4, sessions=1, max_frame=8000, generations=4, log_frequency=2000, seed=3,
                              data_dir="data")
    cmd = bench.lab_command("cartpole", "pb2", args, "r")
    assert 'meta.search_scheduler={"name": "PB2", "perturbation_interval": 2000}' in cmd
    assert "--search-alg" not in cmd and "--search-alg" in bench.lab_command("cartpole", "random", args, "r")
    budget = {"task": "cartpole", "trials": 4, "sessions": 1, "max_frame": 8000, "generations": 4, "seed": 3}
    old = {"cartpole": {**budget, "date": "d1", "methods": {"pbt": {"iqm": 1}, "random": {"iqm": 2}}}}
    merged = bench.merge(old, {**budget, "date": "d2", "methods": {"pb2": {"iqm": 3}, "random": {"iqm": 4}}})
    assert merged["cartpole"]["methods"] == {"pbt": {"iqm": 1}, "random": {"iqm": 4}, "pb2": {"iqm": 3}}
    assert merged["cartpole"]["date"] == "d2"
    other = bench.merge(old, {**budget, "max_frame": 4000, "methods": {"pb2": {"iqm": 3}}})
    assert other["cartpole"]["methods"] == {"pb2": {"iqm": 3}}  # another budget: not comparable, replaced


def test_pb2_equal_or_non_finite_score_changes_give_valid_distinct_picks():
    var = [SearchVar("a", "uniform", [0.0, 1.0])]
    flat = [(0.2, {"a": 0.5}, 1.0), (0.3, {"a": 0.5}, 1.0)]  # no variation: a flat model, picks away from 0.5
    picks = [p["a"] for p in pb2.select(var, flat, 0.4, [{"a": 0.1}] * 2, np.random.default_rng(0))]
    assert len(set(picks)) == 2 and all(abs(p - 0.5) > 0.3 for p in picks)
    finite = [(0.2, {"a": 0.2}, 1.0), (0.3, {"a": 0.8}, 2.0), (0.3, {"a": 0.5}, 3.0)]
    with_inf = [*finite, (0.3, {"a": 0.6}, math.inf), (0.3, {"a": 0.7}, math.nan)]
    assert (pb2.select(var, with_inf, 0.4, [{"a": 0.1}], np.random.default_rng(0))
            == pb2.select(var, finite, 0.4, [{"a": 0.1}], np.random.default_rng(0)))
    history = [Decision(generation=1, frame=400, trial=0, donor=None, score=math.nan, donor_score=None, config={})]
    assert pb2.observations(history, {0: 5.0}, 2, 4) == []
