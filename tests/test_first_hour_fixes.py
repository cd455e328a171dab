"""Issue 23, item 6: the first-hour fixes. The README's commands run as written on a fresh
clone (CSV import, a model outside the catalog, a `trace fit` YAML as a trace, the faceted
plot), the timeline view's legend, did-you-mean for dotted keys, the trace columns a policy
reads, labels of a CPU run, provenance of a hardware file, library warnings and the summary."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from moesim.policies.contract.base import OPTIONAL_COLUMNS
from moesim.policies.contract.registry import make_policy, policy_names
from moesim.sim.cli.main import main
from moesim.sim.config.scenario import load_scenario
from moesim.sim.run.runner import run_loaded
from moesim.traces.format.trace_file import read_trace
from tests.bad_input import DELETE, scen
from tests.util import ROOT

README = (ROOT / "README.md").read_text()


def readme_commands(*starts: str) -> list[str]:
    """The README's command lines (in code blocks) that start with one of ``starts``, comments
    dropped, in the README's order."""
    out = []
    for line in README.splitlines():
        line = line.strip()
        if line.startswith(starts):
            out.append(" ".join(shlex.split(line, comments=True)))
    assert out, f"the README has no command starting with {starts}"
    return out


def run_readme(command: str, cwd: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run one README command line of ``simctl`` in ``cwd`` ($PWD expanded); return stdout."""
    argv = shlex.split(command.replace("$PWD", str(cwd)))
    assert argv[0] == "simctl"
    code = main(argv[1:])
    out, err = capsys.readouterr()
    assert code == 0, f"{command}: {err}"
    return out


def fresh_clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *paths: str) -> Path:
    """A folder holding the repository files ``paths`` at their places; the working directory."""
    for rel in paths:
        src, dst = ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --- the README's trace commands ----------------------------------------------------------------
def test_readme_csv_import_fit_and_runs_work_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The tour's import line (which used to fail: an 8-expert model against top-2 rows, then
    --model required), the fit, a run of the imported trace of a model outside the catalog and
    a run of the fit's YAML as the trace."""
    cwd = fresh_clone(tmp_path, monkeypatch, "docs/examples/routing.csv", "scenarios/quickstart.yaml",
                      "traces/samples/flame-moe-290m.parquet")
    imp, = readme_commands("simctl trace import --from csv")
    fit, = readme_commands("simctl trace fit runs/mine.parquet")
    runs = [c for c in readme_commands("simctl run scenarios/quickstart.yaml --set trace=")]
    assert len(runs) == 2
    run_readme(imp, cwd, capsys)
    trace = read_trace(cwd / "runs" / "mine.parquet", ["weights"])
    assert (trace.model.name, trace.model.num_layers, trace.model.num_experts, trace.model.top_k) == ("my-moe", 4, 16, 2)
    run_readme(fit, cwd, capsys)
    for cmd in runs:
        out = run_readme(cmd + " --json", cwd, capsys)
        metrics = json.loads(out)
        assert metrics["tokens"] > 0
        note = [w for w in metrics["warnings"] if "not in the catalog" in w]
        assert len(note) == 1 and "from the trace" in note[0] and "hidden_size 4096" in note[0]


def test_import_without_a_model_says_what_to_give(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["trace", "import", "--from", "csv", str(ROOT / "docs/examples/routing.csv"), "-o", str(tmp_path / "o.parquet")])
    err = capsys.readouterr().err
    assert code == 2 and "--num-layers, --num-experts and --top-k" in err
    code = main(["trace", "import", "--from", "csv", str(ROOT / "docs/examples/routing.csv"), "-o", str(tmp_path / "o.parquet"),
                 "--model", "olmoe-1b-7b"])
    err = capsys.readouterr().err
    assert code == 2 and "line 2" in err and "--top-k" in err


def imported_trace(tmp_path: Path) -> Path:
    out = tmp_path / "mine.parquet"
    assert main(["trace", "import", "--from", "csv", str(ROOT / "docs/examples/routing.csv"), "-o", str(out),
                 "--model", "my-moe", "--num-layers", "4", "--num-experts", "16", "--top-k", "2"]) == 0
    return out


def test_a_model_outside_the_catalog_takes_the_trace_shape_and_given_sizes(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    trace = imported_trace(tmp_path)
    (tmp_path / "s.yaml").write_text(scen(trace=str(trace), model={"hidden_size": 512, "expert_intermediate_size": 256}))
    result = run_loaded(load_scenario(tmp_path / "s.yaml"))
    m = result.model
    assert (m.name, m.num_layers, m.num_experts, m.top_k, m.hidden_size, m.expert_intermediate_size) == (
        "my-moe", 4, 16, 2, 512, 256)
    assert m.expert_bytes == 3 * 512 * 256 * 2
    note = [w for w in result.metrics["warnings"] if "not in the catalog" in w]
    assert len(note) == 1 and "hidden_size" not in note[0].split("assumed:")[1].split("(")[0]
    # --set on a scenario that names the model builds the same mapping
    (tmp_path / "t.yaml").write_text(scen(trace=str(trace), model="my-moe"))
    over = run_loaded(load_scenario(tmp_path / "t.yaml", ["model.hidden_size=512", "model.expert_intermediate_size=256"]))
    assert over.model == m and over.metrics["tpot_ms"] == result.metrics["tpot_ms"]
    # a misspelt size is named, with the fix
    code = main(["run", str(tmp_path / "t.yaml"), "--set", "model.hiden_size=512"])
    assert code == 2 and "did you mean 'model.hidden_size'" in capsys.readouterr().err


def test_a_trace_fit_yaml_is_a_synthetic_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fit = tmp_path / "fit.yaml"
    assert main(["trace", "fit", str(imported_trace(tmp_path)), "-o", str(fit)]) == 0
    capsys.readouterr()
    knobs = yaml.safe_load(fit.read_text())["synthetic"]
    (tmp_path / "s.yaml").write_text(scen(trace="fit.yaml", model=DELETE))
    loaded = load_scenario(tmp_path / "s.yaml", ["trace.synthetic.requests=2"])
    assert loaded.scenario.trace == {"synthetic": {**knobs, "requests": 2}}
    assert loaded.trace_fit == str(fit)
    result = run_loaded(loaded)
    assert result.metrics["requests"] == 2
    # the same as writing the mapping inline
    (tmp_path / "inline.yaml").write_text(scen(trace={"synthetic": {**knobs, "requests": 2}}, model=DELETE))
    assert run_loaded(load_scenario(tmp_path / "inline.yaml")).metrics["tpot_ms"] == result.metrics["tpot_ms"]
    # --set trace=FIT.yaml, then a knob of it
    (tmp_path / "p.yaml").write_text(scen(model=DELETE))
    later = load_scenario(tmp_path / "p.yaml", [f"trace={fit}", "trace.synthetic.requests=2"])
    assert later.scenario.trace == loaded.scenario.trace
    # a YAML that is no fit is one line saying what a YAML trace holds
    (tmp_path / "other.yaml").write_text("name: x\n")
    code = main(["run", str(tmp_path / "s.yaml"), "--set", "trace=other.yaml"])
    err = capsys.readouterr().err
    assert code == 2 and "other.yaml" in err and "synthetic" in err and len(err.strip().splitlines()) == 1


def test_readme_faceted_plot_works_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    cwd = fresh_clone(tmp_path, monkeypatch, "scenarios/quickstart.yaml", "scenarios/flame-lru.yaml", "scenarios/sweeps",
                      "traces/samples/flame-moe-290m.parquet")
    plot, = [c for c in readme_commands("simctl plot") if "--facet" in c and "--kind speedup" in c]
    out_dir = re.search(r"simctl plot (\S+)", plot)[1]  # type: ignore[index]
    sweep, = [c for c in readme_commands("simctl sweep") if f"--out {out_dir} " in c + " "]
    run_readme(sweep + " --set workload.requests=1 -j 1 --no-progress", cwd, capsys)
    out = run_readme(plot, cwd, capsys)
    assert out.split() == [f"{out_dir}/figures/speedup.png", f"{out_dir}/figures/speedup.pdf"]
    # a facet that is not swept names the swept keys
    code = main(["plot", out_dir, "--kind", "tpot", "--facet", "workload.batch_size"])
    err = capsys.readouterr().err
    assert code == 2 and "cache.rate" in err and "hardware.pcie_gbps" in err


def test_timeline_view_without_a_timeline_has_no_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from moesim.sim.study.timeline_plot import timeline_figure

    (tmp_path / "s.yaml").write_text(scen())
    assert main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    fig = timeline_figure(tmp_path / "r")
    labels = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert "window above" not in labels and "stall on transfers" in labels
    assert "--timeline" in fig.axes[-1].get_title()


# --- did-you-mean ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("key", "named", "meant"), [
    ("cache.rat=0.5", "cache.rat", "cache.rate"), ("cach.rate=0.5", "cach", "cache"),
    ("workload.batch=2", "workload.batch", "workload.batch_size"), ("pcie.ordr=fifo", "pcie.ordr", "pcie.order"),
    ("hardware.pcie_gbs=8", "hardware.pcie_gbs", "hardware.pcie_gbps"),
    ("hardware.cpu.cors=8", "hardware.cpu.cors", "hardware.cpu.cores"),
    ("model.hiden_size=8", "model.hiden_size", "model.hidden_size"),
])
def test_an_unknown_dotted_key_gets_a_did_you_mean(key: str, named: str, meant: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.yaml").write_text(scen())
    code = main(["run", str(tmp_path / "s.yaml"), "--set", key])
    err = capsys.readouterr().err
    assert code == 2 and f"{named}: unknown key; did you mean {meant!r}?" in err, err


def test_a_misspelt_key_in_a_hardware_file_is_named_with_its_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "g.yaml").write_text("vram_gib: 24\npcie_gbs: 25\npeak_tflops: 100\nhbm_gbps: 1000\n")
    assert main(["hardware", str(tmp_path / "g.yaml")]) == 2
    assert "pcie_gbs: unknown key (and 1 more); did you mean 'pcie_gbps'?" in capsys.readouterr().err


# --- trace columns --------------------------------------------------------------------------------
def test_policies_moepic_lists_lookahead_logits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policies", "moepic"]) == 0
    assert "reads when present: lookahead_logits" in capsys.readouterr().out


@pytest.mark.parametrize("name", policy_names())
def test_the_declared_columns_are_all_a_policy_reads(name: str, tmp_path: Path) -> None:
    """A run on only the columns a policy declares (what ``simctl policies NAME`` lists, and all
    the runner loads) equals one on every column of a trace that has them all."""
    (tmp_path / "s.yaml").write_text(scen(trace=str(ROOT / "traces/samples/tiny-moe.parquet"), model="tiny-moe",
                                          policy=name, cache={"rate": 0.25, "buffer_experts": 2},
                                          workload={"requests": 2, "phases": ["decode"]}))
    assert make_policy(name, {}).read_columns() != frozenset(OPTIONAL_COLUMNS), "declare read_columns()"
    loaded = load_scenario(tmp_path / "s.yaml")
    declared = run_loaded(loaded, steps=False).metrics
    every = run_loaded(loaded, steps=False, trace=read_trace(ROOT / "traces/samples/tiny-moe.parquet")).metrics
    for m in (declared, every):
        m.pop("wall_s", None)
    assert declared == every


# --- labels, provenance, library warnings ---------------------------------------------------------
CPU_PROFILE = """provenance: {device: Intel Xeon, device_type: cpu}
hardware:
  name: calibrated-cpu
  vram_gib: 15.6
  pcie_gbps: 5.1
  peak_tflops: 0.3
  hbm_gbps: 9
  source: "calibration: measured on Intel Xeon"
"""


@pytest.mark.parametrize("stated", [True, False])
def test_a_cpu_run_is_labelled_for_the_cpu(stated: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A profile measured on the CPU (``device: cpu``, or an older one whose provenance says so)
    has no GPU, PCIe or VRAM in its summary, and the tiny model's MiB are not ``0.00 GiB``."""
    text = CPU_PROFILE if not stated else CPU_PROFILE.replace("  name: calibrated-cpu\n", "  name: calibrated-cpu\n  device: cpu\n")
    (tmp_path / "p.yaml").write_text(text)
    code = main(["run", str(ROOT / "scenarios/validate-cpu.yaml"), "--set", f"hardware={tmp_path / 'p.yaml'}",
                 "--no-baselines"])
    out = capsys.readouterr().out
    assert code == 0
    body = out.split("overrides")[1]      # the file's name is in the overrides line
    for word in ("GPU", "PCIe", "VRAM", "0.00 GiB"):
        assert word not in body, word
    assert re.search(r"\ncopies +\d", out) and re.search(r"\nmemory peak +3\.\d\d MiB", out)
    assert re.search(r"cache +8 of 16 experts per layer \(50%\), 3\.00 MiB", out)
    # a GPU keeps its words
    assert main(["run", str(ROOT / "scenarios/validate-cpu.yaml"), "--no-baselines"]) == 0
    gpu = capsys.readouterr().out
    assert "\nPCIe " in gpu and "\nVRAM peak" in gpu and "GPU busy" in gpu


def test_hardware_file_values_are_not_called_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "my-gpu.yaml").write_text("name: my-gpu\nvram_gib: 24\npcie_gbps: 25\npeak_tflops: 160\n"
                                          "hbm_gbps: 1000\nkernel_us: 4\n")
    assert main(["hardware", str(tmp_path / "my-gpu.yaml")]) == 0
    rows = {ln.split("│")[1].strip(): ln.split("│")[3].strip() for ln in capsys.readouterr().out.splitlines()
            if ln.count("│") == 4}
    for field in ("vram_gib", "pcie_gbps", "peak_tflops", "hbm_gbps", "kernel_us"):
        assert rows[field].startswith("set in") and "my-gpu.yaml" in rows[field], (field, rows[field])
    for field in ("pcie_latency_us", "evict_us", "copy_engines"):
        assert rows[field].startswith("default of HardwareSpec"), (field, rows[field])


def test_library_deprecations_stay_inside_moesim_calls() -> None:
    """transformers' FutureWarning about ``past_key_values`` (how the tracer drives the model)
    is not the user's to see; the user's own FutureWarnings still are."""
    pytest.importorskip("transformers")
    import warnings

    from moesim.traces.tiny.tiny_model import model_dir
    from moesim.traces.tracer import tracer
    from moesim.traces.tracer.model_loading import load_model

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loaded = load_model(str(model_dir()))
        tracer.trace_model(loaded.model, [tracer.Prompt((72, 105, 33))], name="tiny", max_new_tokens=3)
        warnings.warn("the user's own", FutureWarning, stacklevel=1)
    future = [str(w.message) for w in seen if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    assert future == ["the user's own"]


# --- the summary ----------------------------------------------------------------------------------
def summary_rows(out: str) -> list[tuple[str, str]]:
    rows = []
    for line in out.splitlines()[1:]:
        m = re.match(r"(\S.*?)\s{2,}(\S.*)", line)
        if m:
            rows.append((m[1], m[2].strip()))
    return rows


def test_summary_leads_with_policy_cache_trace_and_speedups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.yaml").write_text(scen(policy={"name": "mixtral-offloading", "params": {"prefetch_experts": 2}}))
    assert main(["run", str(tmp_path / "s.yaml")]) == 0
    rows = summary_rows(capsys.readouterr().out)
    assert [k for k, _ in rows[:4]] == ["policy", "cache", "trace", "speed-up"]
    assert rows[0][1].startswith("mixtral-offloading (") and "prefetch_experts 2" in rows[0][1]
    assert rows[1][1].startswith("16 of 64 experts per layer (25%), 0.52 GiB")
    assert rows[2][1].startswith("flame-moe-290m.parquet (flame-moe-290m, 8 MoE layers x 64 experts, top-6)")
    # the speed-ups are the baselines' own runs of the same scenario
    speed = rows[3][1]
    tpot = {}
    for name in ("mixtral-offloading", "lru", "no-cache"):
        assert main(["run", str(tmp_path / "s.yaml"), "--json", "--set", f"policy={name}"]) == 0
        tpot[name] = json.loads(capsys.readouterr().out)["tpot_ms"]["mean"]
    for name in ("lru", "no-cache"):
        assert f"{tpot[name] / tpot['mixtral-offloading']:.2f}x over {name}" in speed, speed
    # an lru run compares with no-cache only; --no-baselines drops the line
    assert main(["run", str(tmp_path / "s.yaml"), "--set", "policy=lru"]) == 0
    speed = dict(summary_rows(capsys.readouterr().out))["speed-up"]
    assert "over no-cache" in speed and "over lru" not in speed
    assert main(["run", str(tmp_path / "s.yaml"), "--no-baselines"]) == 0
    assert "speed-up" not in dict(summary_rows(capsys.readouterr().out))


def test_baselines_that_would_not_be_cheap_are_named_not_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from moesim.sim.run import baselines

    monkeypatch.setattr(baselines, "GENERIC_LIMIT", 100)
    (tmp_path / "s.yaml").write_text(scen(policy="lfu"))
    assert main(["run", str(tmp_path / "s.yaml")]) == 0
    speed = dict(summary_rows(capsys.readouterr().out))["speed-up"]
    assert re.search(r"^\d\.\d\dx over lru", speed)        # a kernel: cheap at any size
    assert "no-cache not run: 6,144 expert accesses without a fast kernel; --set policy=no-cache runs it" in speed
