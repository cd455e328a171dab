"""Paper-ready figures: one colour and marker per policy in every command, titles naming model,
hardware and trace, ticks at the swept values, facets, --policies, a note for the policies
without a result, and vector output."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest
import yaml

from moesim.policies.contract.registry import policy_names
from moesim.sim.cli.main import main
from moesim.sim.study.compare import comparison_figure, rank
from moesim.sim.study.palette import COLORS, policy_style, style_at
from moesim.sim.study.plot import PlotError, load_table, ranked_bars, series_styles, sweep_figure
from tests.util import ROOT

matplotlib.use("Agg")
QUICKSTART = ROOT / "scenarios" / "flame-lru.yaml"
TITLE = "flame-moe-290m on rtx-4090, trace flame-moe-290m.parquet"


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lru, fifo, belady and moepic (n/a on this trace) x two cache rates x two bandwidths."""
    tmp = tmp_path_factory.mktemp("fig")
    spec = {"name": "fig", "base": str(QUICKSTART), "set": {"workload.requests": 1},
            "grid": {"policy": ["lru", "fifo", "belady", "moepic"], "cache.rate": [0.125, 0.375],
                     "hardware.pcie_gbps": [16, 32]}}
    (tmp / "s.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["sweep", str(tmp / "s.yaml"), "--out", str(tmp / "o"), "-j", "1", "--no-progress"]) == 0
    return tmp / "o"


def test_every_registered_policy_has_its_own_colour_and_marker() -> None:
    names = policy_names()
    styles = [policy_style(n) for n in names]
    assert len(set(styles)) == len(names)
    # the first thirty slots share no colour; slots thirty apart share a colour, never a marker
    assert len({style_at(i)[0] for i in range(len(COLORS))}) == len(COLORS)
    assert all(style_at(i)[1] != style_at(i + len(COLORS))[1] for i in range(3 * len(COLORS)))
    # the same whatever is drawn beside it, and outside the registry stable by name
    assert series_styles(["lru"])["lru"] == series_styles(["belady", "fifo", "lru"])["lru"] == policy_style("lru")
    assert policy_style("my-plugin") == policy_style("my-plugin")
    assert series_styles(["a", "b"], policies=False) == {"a": style_at(0), "b": style_at(1)}


def _line_colours(fig: matplotlib.figure.Figure) -> dict[str, str]:
    from matplotlib.colors import to_hex

    out = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            label = line.get_label().split(" (")[0]
            if not label.startswith("_"):
                out[label] = to_hex(line.get_color())
    handles, labels = fig.axes[0].get_legend_handles_labels()
    for h, lab in zip(handles, labels, strict=True):
        out[lab.split(" (")[0]] = to_hex(h.lines[0].get_color() if hasattr(h, "lines") else h.get_color())
    return out


def test_sweep_and_compare_figures_share_the_policy_colours(table: Path) -> None:
    df, params = load_table(table)
    plot_colours = _line_colours(sweep_figure(df, params, "tpot", facet="hardware.pcie_gbps"))
    comp = rank(df[df["hardware.pcie_gbps"] == 16], metric="tpot")
    compare_colours = _line_colours(comparison_figure(comp))
    for name in ("lru", "fifo", "belady"):
        assert plot_colours[name] == compare_colours[name] == policy_style(name)[0]
    bars = ranked_bars(df[(df["cache.rate"] == 0.125) & (df["hardware.pcie_gbps"] == 16)], "tpot")
    from matplotlib.colors import to_hex

    bar_colours = {to_hex(p.get_facecolor()[:3]) for p in bars.axes[0].patches}
    assert {policy_style(n)[0] for n in ("lru", "fifo", "belady")} == bar_colours
    assert bars.axes[0].get_title() == TITLE


def test_title_ticks_facets_and_the_note_for_policies_without_a_result(table: Path) -> None:
    df, params = load_table(table)
    fig = sweep_figure(df, params, "hit-rate", facet="hardware.pcie_gbps")
    assert fig._suptitle is not None and fig._suptitle.get_text() == TITLE
    assert [ax.get_title() for ax in fig.axes] == ["host-to-device bandwidth (GB/s) = 16",
                                                   "host-to-device bandwidth (GB/s) = 32"]
    for ax in fig.axes:
        assert list(ax.get_xticks()) == [0.125, 0.375]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0.125", "0.375"]
    notes = [ln for t in fig.texts for ln in t.get_text().splitlines()]
    assert "no result: moepic (n/a)" in notes
    picked = sweep_figure(df, params, "tpot", policies=["lru", "belady"])
    labels = picked.axes[0].get_legend_handles_labels()[1]
    assert labels == ["lru", "belady (bound)"]
    assert not any(t.get_text().startswith("no result") for t in picked.texts)    # moepic not asked for
    with pytest.raises(PlotError, match="--policies lfu: not in this table"):
        sweep_figure(df, params, "tpot", policies=["lfu"])


def test_plot_policies_and_vector_formats(table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(table), "-k", "tpot", "-f", "svg", "-f", "pdf", "--policies", "lru,fifo",
                 "--facet", "hardware.pcie_gbps", "-o", str(tmp_path)]) == 0
    svg = (tmp_path / "tpot.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "<path" in svg     # vector, not a raster
    assert "<image" not in svg
    assert (tmp_path / "tpot.pdf").read_bytes().startswith(b"%PDF")
    capsys.readouterr()
    assert main(["plot", str(table), "--policies", "lfu"]) == 2
    assert "--policies lfu: not in this table" in capsys.readouterr().err


def _many_policies() -> tuple[object, list[str]]:
    """A sweep table of 22 lossless policies, a bound and a lossy one at three cache rates, one
    of them (the first) 40 times slower than the others, and one n/a."""
    import pandas as pd

    names = [n for n in policy_names() if n not in ("belady", "oracle-prefetch", "random-substitute",
                                                     "buddymoe", "commitmoe", "activeevict", "moepic")][:22]
    rows = []
    for i, name in enumerate([*names, "belady", "random-substitute", "moepic"]):
        for rate in (0.125, 0.25, 0.5):
            slow = 40.0 if i == 0 else 1.0
            rows.append({"policy": name, "cache.rate": rate, "status": "n/a" if name == "moepic" else "ok",
                         "bound": name == "belady", "kind": "oracle" if name == "belady" else
                         "lossy" if name == "random-substitute" else "lossless",
                         "tpot_ms_mean": slow * (1.0 + 0.05 * i) / (1 + rate), "hit_rate": 0.3 + 0.01 * i + rate / 2})
    return pd.DataFrame(rows), names


def test_an_all_policy_figure_is_legible() -> None:
    """Issue 35: a legend larger than the plot, the n/a list drawn over it, one policy holding
    the TPOT axis hostage. Now: the bounds, the best lossless and the best two lossy in colour
    (the others grey, named under the figure), a log axis said on the axis and in the caption,
    the caption clear of the legend, and a PNG of at least 1,280 px."""
    from matplotlib.transforms import Bbox

    from moesim.sim.study.figure_files import png_dpi
    from moesim.sim.study.plot import GREY, TOP_N

    df, names = _many_policies()
    fig = sweep_figure(df, ["policy", "cache.rate"], "tpot")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylabel().endswith("log scale")
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "belady (bound)" in legend and "random-substitute (lossy)" in legend and names[0] not in legend
    assert len(legend) <= TOP_N + 1
    grey = [ln for ln in ax.get_lines() if ln.get_label() == "_grey"]
    assert len(grey) == len(names) + 2 - len(legend) and all(ln.get_color() == GREY for ln in grey)
    text = " ".join(t.get_text() for t in fig.texts)
    assert f"{names[0]} averages" in text and "log scale" in text and "moepic (n/a)" in text
    assert all(n in text for n in names if n not in " ".join(legend))
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.texts if t is not fig._suptitle]
    legend_box = fig.legends[0].get_window_extent(renderer)
    assert not any(Bbox.intersection(b, legend_box) for b in boxes)
    box = fig.get_tightbbox(renderer)
    assert box.width * png_dpi(fig) >= 1280
    hit = sweep_figure(df, ["policy", "cache.rate"], "hit-rate")
    assert hit.axes[0].get_yscale() == "linear"     # hit rates are bounded: never a log axis


def test_the_palette_has_thirty_colours_told_apart() -> None:
    """Thirty colours, any two at least 27 CIELAB units apart (lru, lfru and cpu-moe were all
    blue); each registered policy has its own colour."""
    import itertools

    import numpy as np
    from matplotlib.colors import to_rgb

    def lab(c: str) -> np.ndarray:
        r = np.array(to_rgb(c))
        r = np.where(r > 0.04045, ((r + 0.055) / 1.055) ** 2.4, r / 12.92)
        m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
        xyz = m @ r / np.array([0.9505, 1.0, 1.089])
        f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
        return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])

    assert len(COLORS) >= 30
    assert min(float(np.linalg.norm(lab(a) - lab(b))) for a, b in itertools.combinations(COLORS, 2)) >= 27
    assert len({policy_style(n)[0] for n in policy_names()}) == len(policy_names())


def test_ranked_bars_mark_ties_and_turn_to_dots_on_a_log_axis() -> None:
    """One rate of the table above: accelerate-like 40x outlier, so the axis is logarithmic and
    drawn as dots (a bar on a log axis has no zero); policies 5% apart rank apart, and two
    within 1% share a rank marked `=`."""
    df, names = _many_policies()
    one = df[df["cache.rate"] == 0.25].copy()
    fig = ranked_bars(one, "tpot")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and not ax.patches
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == f"1. {names[1]}" and labels[1] == f"2. {names[2]}"
    one.loc[one["policy"] == names[2], "tpot_ms_mean"] = float(one[one["policy"] == names[1]]["tpot_ms_mean"].iloc[0]) * 1.005
    labels = [t.get_text() for t in ranked_bars(one, "tpot").axes[0].get_yticklabels()]
    assert labels[:3] == [f"1=. {names[1]}", f"1=. {names[2]}", f"3. {names[3]}"]
