"""Robust statistics over sessions (IQM, stratified-bootstrap CI) against hand-computed values,
and ``lab compare`` writing a valid PNG and HTML page."""

import json
import struct
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from lab_helpers import run_cli

from orchestrator.report import stats
from orchestrator.report.graphs import PNG_SIGNATURE


def test_iqm_drops_a_quarter_at_each_end():
    assert stats.iqm([1, 2, 3, 4, 5, 6, 7, 100]) == 4.5          # mean of 3, 4, 5, 6
    assert stats.iqm([1, 2, 3, 100]) == 2.5                      # mean of 2, 3
    assert stats.iqm([7, 1, 4, 100, 2]) == pytest.approx(13 / 3)  # n=5: floor(5/4)=1 cut: mean of 2, 4, 7
    assert stats.iqm([1.0, 3.0]) == 2.0                          # fewer than 4: the mean
    np.testing.assert_allclose(stats.iqm(np.array([[1, 10], [2, 20], [3, 30], [100, 40]])), [2.5, 25])
    with pytest.raises(ValueError):
        stats.iqm([])


def test_bootstrap_ci_of_two_sessions_is_their_range():
    # resamples of (0, 10): means 0 (p=1/4), 5 (1/2), 10 (1/4) -> 2.5th and 97.5th percentiles 0 and 10
    assert stats.bootstrap_ci(np.array([0.0, 10.0]), statistic=np.mean) == (0.0, 10.0)
    assert stats.bootstrap_ci(np.array([3.0, 3.0, 3.0])) == (3.0, 3.0)
    low, high = stats.bootstrap_ci(np.arange(8.0))
    assert 0 <= low < stats.iqm(np.arange(8.0)) < high <= 7
    assert stats.bootstrap_ci(np.arange(8.0)) == (low, high)  # seeded: reproducible
    with pytest.raises(ValueError, match="confidence"):
        stats.bootstrap_ci(np.arange(3.0), confidence=1.5)


def test_summary_and_curve_band():
    out = stats.summary([1.0, 2.0, 3.0, 100.0, None])
    assert out["mean"] == 26.5 and out["iqm"] == 2.5 and out["n"] == 4
    assert out["std"] == pytest.approx(np.std([1, 2, 3, 100], ddof=1))
    assert out["ci"][0] <= 2.5 <= out["ci"][1]
    assert stats.summary([5.0])["ci"] == [5.0, 5.0] and stats.summary([5.0])["std"] is None
    mid, low, high = stats.curve_band(np.array([[1.0, 1.0], [0.0, 10.0]]))  # 2 frames x 2 sessions
    assert mid.tolist() == [1.0, 5.0] and low.tolist() == [1.0, 0.0] and high.tolist() == [1.0, 10.0]


def fake_run(root, name, finals):
    """A dev-like run directory: spec file and one train_df per session (no checkpoints)."""
    predir = root / f"ppo_cartpole_{name}"
    (predir / "ppo_cartpole_spec.json").parent.mkdir(parents=True)
    (predir / "ppo_cartpole_spec.json").write_text(json.dumps({"name": "ppo_cartpole",
                                                               "env": {"name": "CartPole-v1"}}))
    for s, final in enumerate(finals):
        (predir / f"t0/s{s}").mkdir(parents=True)
        df = pd.DataFrame({"frame": [400, 800, 1200], "total_reward": [20.0, 40.0, final],
                           "total_reward_ma": [20.0, 30.0, final]})
        df.to_parquet(predir / f"t0/s{s}/train_df.parquet")
    return predir


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def outside():
    """A new directory under the system temp dir, removed after the test: no data dir above it (pytest's basetemp,
    above ``tmp_path``, holds the ``.assets`` of runs other tests wrote directly in their ``tmp_path``)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="lab_compare_"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_lab_compare_writes_png_and_html(tmp_path, capsys, outside):
    a = fake_run(tmp_path, "2026_01_01_000000", [100.0, 200.0, 300.0, 400.0])
    b = fake_run(tmp_path, "2026_01_02_000000", [50.0, 60.0])
    out = outside / "out" / "cmp"
    assert run_cli("compare", str(a), f"{b}/t0", "--out", str(out)) == 0
    printed = capsys.readouterr().out
    assert f"{a.name}: frame=1200 IQM total_reward_ma=250" in printed
    assert f"{b.name}/t0: frame=1200 IQM total_reward_ma=55" in printed
    width, height = png_size((outside / "out/cmp.png").read_bytes())
    assert (width, height) == (720, 432)  # 9 x 5.4 in: the legend below the plot area
    html = (outside / "out/cmp.html").read_text()
    assert html.lower().startswith("<!doctype html>") and html.rstrip().endswith("</html>")
    js = f"plotly-{version('plotly')}.min.js"  # outside a data dir: one named copy beside the page
    assert f'src="{js}"' in html
    assert f"{a.name} (4 sessions)" in html and "CartPole-v1 reward_threshold 475" in html
    assert (outside / "out" / js).stat().st_size > 1_000_000
    assert sorted(p.name for p in (outside / "out").iterdir()) == sorted(["cmp.png", "cmp.html", js])


@pytest.mark.parametrize("given, png, html", [("cmp2.png", "cmp2.png", "cmp2.html"),
                                              ("cmp3.html", "cmp3.png", "cmp3.html"),
                                              ("cmp4", "cmp4.png", "cmp4.html")])
def test_lab_compare_takes_out_as_given(tmp_path, given, png, html):
    a = fake_run(tmp_path, "2026_01_01_000000", [100.0, 200.0])
    assert run_cli("compare", str(a), "--out", str(tmp_path / "o" / given)) == 0
    assert sorted(p.name for p in (tmp_path / "o").iterdir() if "plotly" not in p.name) == sorted([png, html])


def test_lab_compare_inside_a_data_dir_uses_its_shared_plotly_copy(tmp_path):
    a = fake_run(tmp_path, "2026_01_01_000000", [100.0, 200.0])
    js = f"plotly-{version('plotly')}.min.js"
    (tmp_path / ".assets").mkdir()
    (tmp_path / ".assets" / js).write_text("// shared")
    assert run_cli("compare", str(a), "--out", str(tmp_path / "cmp" / "x")) == 0
    assert f'src="../.assets/{js}"' in (tmp_path / "cmp" / "x.html").read_text()
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir()) == ["x.html", "x.png"]
    assert (tmp_path / ".assets" / js).read_text() == "// shared"  # never rewritten


def test_html_page_is_plotlys_validated_page_without_validation(tmp_path):
    """``compare.write_html`` sets plotly's default template itself instead of validating the figure (which imports
    plotly's validator tree): the figure JSON in the page equals the one plotly's validation writes."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    from orchestrator.report import compare

    figure = {"data": [{"type": "scatter", "x": [1, 2, 3], "y": [3.5, 1.0, 2.0], "mode": "lines", "name": "mean",
                        "line": {"color": "#1f77b4"}}],
              "layout": {"title": {"text": "t0"}, "xaxis": {"title": {"text": "frame"}}, "hovermode": "x unified"}}
    compare.write_html(str(tmp_path / "page.html"), figure, "the title")
    page = (tmp_path / "page.html").read_text()
    validated = pio.to_html(figure, include_plotlyjs="directory", full_html=True, validate=True)

    def plot_args(html):  # the data and layout JSON given to Plotly.newPlot(div_id, data, layout, config)
        decoder, pos = json.JSONDecoder(), html.index("Plotly.newPlot(") + len("Plotly.newPlot(")
        values = []
        for _ in range(3):
            pos = len(html) - len(html[pos:].lstrip(" \n,"))
            value, pos = decoder.raw_decode(html, pos)
            values.append(value)
        return values[1], values[2]

    assert plot_args(page) == plot_args(validated)  # the same figure, template included (keys in another order)
    assert "colorway" in plot_args(page)[1]["template"]["layout"]
    assert "<title>the title</title>" in page and 'src="plotly.min.js"' in page
    assert (tmp_path / "plotly.min.js").read_text() == get_plotlyjs()


def test_lab_compare_bad_input_exits_2(tmp_path, capsys):
    assert run_cli("compare", str(tmp_path / "missing")) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "not_a_run").mkdir()
    assert run_cli("compare", str(tmp_path / "not_a_run")) == 2
    err = capsys.readouterr().err
    assert "neither a run directory" in err and "Traceback" not in err
    empty = fake_run(tmp_path, "2026_01_03_000000", [])
    assert run_cli("compare", str(empty)) == 2 and "no session" in capsys.readouterr().err
