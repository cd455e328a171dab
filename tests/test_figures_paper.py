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
    # the first twenty slots share no colour; slots twenty apart share a colour, never a marker
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
