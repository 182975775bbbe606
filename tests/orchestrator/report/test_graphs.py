"""The graphs' content, read from the matplotlib and plotly figure objects (no pixels): the PBT lineage's panel per
searched key, the PBT experiment graph, constant panels left out, readable log axes, one curve where the mean and the
IQM coincide, legends outside the plot area, and ``lab compare``'s legend naming what each curve ran."""

import json

import numpy as np
import pandas as pd
import pytest
from test_stats import fake_run

from orchestrator.report import compare, experiment_graph, graphs, pbt_graph
from orchestrator.search.decision import Decision
from orchestrator.spec.search_space import SearchVar

LR, GAMMA = "agent.net.optim_spec.lr", "agent.algorithm.gamma"
INITIAL = {0: {LR: 1e-3, GAMMA: 0.99}, 1: {LR: 3e-4, GAMMA: 0.95}, 2: {LR: 5e-3, GAMMA: 0.9},
           3: {LR: 2e-4, GAMMA: 0.97}}


def pbt_records() -> list[Decision]:
    """Three decisions of 4 trials at frames 200, 400, 600 (as ``pbt_policy.decide`` writes them): t3 continues from
    t0 at generation 1, t1 from t2 at generation 2, t3 from t2 at generation 3."""
    configs = {t: dict(c) for t, c in INITIAL.items()}
    exploits = {1: {3: (0, 1.2)}, 2: {1: (2, 0.8)}, 3: {3: (2, 1.2)}}
    records = []
    for g in (1, 2, 3):
        scores = {t: float(10 * g + (3 - t if g < 2 else t)) for t in range(4)}
        for t in range(4):
            donor, factor = exploits[g].get(t, (None, None))
            if donor is not None:
                configs[t] = {LR: configs[donor][LR] * factor, GAMMA: configs[donor][GAMMA]}
            records.append({"version": 2, "generation": g, "frame": 200 * g, "trial": t, "rank": 1, "failed": False,
                            "donor": donor, "score": scores[t], "donor_score": None if donor is None else
                            scores[donor], "config": dict(configs[t])})
    return [Decision.from_json(r) for r in records]


def lineage() -> pbt_graph.Lineage:
    return pbt_graph.lineage_of(pbt_records(), INITIAL, {0: 40.0, 1: 42.0, 2: 45.0, 3: 47.0}, 800,
                                frozenset({LR}))


def test_the_lineage_has_a_panel_per_key_with_each_trials_values_in_frame_order():
    lin, records = lineage(), pbt_records()
    fig = pbt_graph.lineage_mpl(lin, "lineage")
    score, lr, gamma = fig.axes
    assert (score.get_ylabel(), lr.get_ylabel(), gamma.get_ylabel()) == ("score\n(mean return)", "lr", "gamma")
    assert lr.get_yscale() == "log" and gamma.get_yscale() == "linear"
    colors = pbt_graph.trial_colors(lin)
    for ax, key in ((lr, LR), (gamma, GAMMA)):
        lines = [line for line in ax.get_lines() if line.get_drawstyle() == "steps-post"]
        assert len(lines) == 4
        for t, line in enumerate(lines):
            want = [INITIAL[t][key]] + [r.config[key] for r in records if r.trial == t]
            assert list(line.get_xdata()) == [0, 200, 400, 600, 800]
            np.testing.assert_allclose(line.get_ydata(), want + want[-1:])
            assert line.get_color() == colors[t]
    # t3's lr: 2e-4, then t0's 1e-3 x1.2 (gen 1), kept, then t2's 5e-3 x1.2 (gen 3)
    np.testing.assert_allclose(lines_of(lr)[3], [2e-4, 1.2e-3, 1.2e-3, 6e-3, 6e-3])


def lines_of(ax) -> list[list[float]]:
    return [list(line.get_ydata()) for line in ax.get_lines() if line.get_drawstyle() == "steps-post"]


def test_the_lineage_legend_names_every_trial_alike_and_sits_outside_the_axes():
    fig = pbt_graph.lineage_mpl(lineage(), "lineage")
    legend = fig.axes[0].get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == ["t0", "t1", "t2", "t3", "exploit: continues\nfrom a donor", "best trial's\nancestry"]
    trials = legend.legend_handles[:4]
    assert {(h.get_marker(), h.get_linestyle(), h.get_linewidth()) for h in trials} == {("o", "-", 1.5)}
    fig.canvas.draw()
    box, axes_box = legend.get_window_extent(), fig.axes[0].get_window_extent()
    assert box.x0 >= axes_box.x1  # right of the plot area: it hides no point
    # the best ancestry is a grey underlay: every score edge keeps its trial's colour on top of it
    score = fig.axes[0]
    grey = [line for line in score.get_lines() if line.get_color() == "0.6"]
    assert grey and all(line.get_zorder() < 2 for line in grey)
    assert not any(line.get_color() == "black" for line in score.get_lines())


def test_the_best_path_and_the_plotly_page_of_the_lineage():
    lin = lineage()
    assert lin.best_path == [(1, 2), (2, 2), (3, 2), (4, 3)]  # t3 (47) continued from t2 at generation 3
    fig = pbt_graph.lineage_figure(lin, "lineage")
    lr_traces = [t for t in fig["data"] if t.get("yaxis") == "y2"]
    assert [t["name"] for t in lr_traces] == ["t0", "t1", "t2", "t3"]
    assert all(t["line"]["shape"] == "hv" for t in lr_traces)
    assert fig["layout"]["yaxis2"]["type"] == "log" and fig["layout"]["yaxis3"]["title"]["text"] == "gamma"
    assert [t["name"] for t in fig["data"] if t.get("showlegend", True)] == ["t0", "t1", "t2", "t3"]


def test_an_unfinished_population_draws_its_values_to_the_last_decision():
    lin = pbt_graph.lineage_of(pbt_records(), INITIAL, {}, 800)
    assert lin.end_frame == 600 and (4, 0) not in lin.points
    frames, values = pbt_graph.steps(lin, LR)[0]
    assert frames == [0, 200, 400, 600] and values == [1e-3] * 4
    assert pbt_graph.lineage_of([], INITIAL, {}, 800) is None


def experiment_df() -> pd.DataFrame:
    return pd.DataFrame({"trial": [3, 2, 1, 0], LR: [6e-3, 5e-3, 4e-3, 1e-3], GAMMA: [0.9, 0.9, 0.9, 0.99],
                         "status": "done", "strength": [30.0, 28.0, 25.0, 20.0],
                         "total_reward_ma": [47.0, 45.0, 42.0, 40.0], "frame": 800})


def test_the_pbt_experiment_graph_shows_final_scores_and_the_lineage_and_no_constant_panel():
    fig = experiment_graph.experiment_figure(experiment_df(), [], "search", lineage())
    bars, scores = fig.axes
    widths = {p.get_y() + p.get_height() / 2: p.get_width() for p in bars.patches}
    assert [widths[y] for y in sorted(widths)] == [40.0, 42.0, 45.0, 47.0]  # best at the top
    labels = [t.get_text() for t in bars.get_yticklabels()]
    assert labels[-1].startswith("t3\nlr=0.006, gamma=0.9; strength 30")
    assert scores.get_xlabel() == "frame" and "frame" not in [ax.get_ylabel() for ax in fig.axes]
    width, height = fig.get_size_inches()
    assert width > height


def test_a_plain_experiment_graph_leaves_out_a_constant_metric_and_labels_its_log_axis_readably():
    df = experiment_df().assign(**{LR: [1.1e-4, 1.5e-4, 2.2e-4, 3.9e-4]})  # under a decade: minor ticks only
    variables = [SearchVar(LR, "loguniform", [1e-4, 4e-4]), SearchVar(GAMMA, "uniform", [0.9, 0.99])]
    fig = experiment_graph.plain_figure(df, variables, "search")
    assert [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()] == ["strength", "total_reward_ma"]
    assert "frame=800" in fig._suptitle.get_text()
    width, height = fig.get_size_inches()
    assert width > height
    fig.canvas.draw()
    lr_ax = fig.axes[2]
    assert lr_ax.get_xscale() == "log"
    lo, hi = lr_ax.get_xlim()
    shown = [(t.get_text(), t.get_window_extent()) for t in lr_ax.get_xticklabels(which="both")
             if t.get_text() and t.get_visible() and lo <= t.get_position()[0] <= hi]
    assert [text for text, _ in shown] == ["1.5e-4", "2e-4", "3e-4", "4e-4"]
    assert not [t for t in lr_ax.get_xticklabels(which="minor") if t.get_text()]
    for (_, a), (_, b) in zip(shown, shown[1:]):
        assert a.x1 < b.x0  # no two labels overprint


def test_log_ticks_and_labels():
    assert graphs.log_ticks(1e-5, 2e-2) == pytest.approx([1e-5, 1e-4, 1e-3, 1e-2])
    assert graphs.log_ticks(1e-4, 9e-4) == pytest.approx([1e-4, 2e-4, 5e-4])
    assert graphs.log_ticks(1e-12, 1.0) == pytest.approx([1e-12, 1e-9, 1e-6, 1e-3, 1.0])  # every 3rd decade
    assert [graphs.log_label(v) for v in (2e-4, 1.0, 5000.0, 0.05, 1e-5)] == \
        ["2e-4", "1", "5e+3", "0.05", "1e-5"]


# ---------------------------------------------------------------- trial graph and lab compare

def sessions(n: int, spread: float = 0.0) -> dict[int, pd.DataFrame]:
    return {s: pd.DataFrame({"frame": [400, 800, 1200], "total_reward_ma": [10.0 + spread * s ** 2,
                                                                            20.0 + spread * s ** 2, 30.0]})
            for s in range(n)}


@pytest.mark.parametrize("n, spread", [(2, 5.0), (3, 5.0), (5, 0.0)])
def test_where_mean_and_iqm_coincide_one_line_and_one_band(n, spread):
    dfs = sessions(n, spread)
    (ax,) = graphs.trial_figure(dfs, [], "t0").axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == \
        [f"mean = IQM of {n} sessions,\nband: 95% bootstrap CI"]
    assert len(ax.collections) == 1 and len(ax.get_lines()) == 1
    band = graphs.iqm_band(graphs.stack_sessions(dfs))
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), graphs.stack_sessions(dfs).mean(axis=1))
    html = compare.trial_traces(dfs, "t0", None, [])
    named = [t["name"] for t in html["data"] if t.get("showlegend", True) and t.get("legendgroup") != "sessions"]
    assert named == [f"mean = IQM of {n} sessions, band: 95% bootstrap CI"]
    fill = next(t for t in html["data"] if t.get("fill") == "toself")
    np.testing.assert_allclose(fill["y"], list(band["high"]) + list(band["low"])[::-1])


def test_four_differing_sessions_keep_the_mean_and_the_iqm_apart():
    dfs = sessions(4, 5.0)
    (ax,) = graphs.trial_figure(dfs, [], "t0").axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "+-1 std across sessions", "mean total_reward_ma (4 sessions)", "95% bootstrap CI of the IQM",
        "IQM across sessions"]
    fig = ax.figure
    fig.canvas.draw()
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1


def test_compare_legend_names_the_algorithm_or_a_search_trials_values(tmp_path):
    a = fake_run(tmp_path, "2026_01_01_000000", [100.0, 200.0])
    spec = json.loads((a / "ppo_cartpole_spec.json").read_text())
    (a / "ppo_cartpole_spec.json").write_text(json.dumps({**spec, "agent": {"algorithm": {"name": "PPO"}}}))
    named = tmp_path / "tour"
    a.rename(named)  # a --name run: its directory does not start with the spec name
    b = fake_run(tmp_path, "2026_01_02_000000", [50.0, 60.0, 70.0])
    spec = json.loads((b / "ppo_cartpole_spec.json").read_text())
    (b / "ppo_cartpole_spec.json").write_text(json.dumps({**spec, "search": {"x": 1},
                                                          "agent": {"algorithm": {"name": "PPO"}}}))
    (b / "t0/trial.json").write_text(json.dumps({"trial": 0, "values": {LR: 0.0012345, "agent.net.hid": [64]}}))
    c = fake_run(tmp_path, "2026_01_03_000000", [1.0])
    (c / "ppo_cartpole_spec.json").write_text(json.dumps({"name": "ppo_cartpole", "env": {"name": "CartPole-v1"},
                                                          "agent": {"algorithm": {"name": "SAC"}}}))
    curves = compare.source_curves(str(b)) + compare.source_curves(str(c))
    assert [c.legend for c in curves] == [f"{b.name}: lr=0.001234, hid=[64] (3 sessions)",
                                          f"{c.name}: SAC (1 session)"]
    assert compare.curve_detail(str(named), {"name": "ppo_cartpole", "agent": {"algorithm": {"name": "PPO"}}},
                                0) == "PPO ppo_cartpole"
    fig = compare.compare_figure(curves, {}, "t")
    assert [t["name"] for t in fig["data"] if t.get("showlegend", True)] == [c.legend for c in curves]
    fig = compare.compare_mpl(curves, {"CartPole-v1": 475.0}, "t")
    (ax,) = fig.axes
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [c.legend for c in curves] + [
        "CartPole-v1 reward_threshold 475"]
    fig.tight_layout()
    fig.canvas.draw()
    assert legend.get_window_extent().y1 < ax.get_window_extent().y0  # below the plot area: it hides no curve
