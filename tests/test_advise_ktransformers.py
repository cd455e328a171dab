"""kTransformers in ``simctl advise``: its options on a hand-sized model (exact settings, budgets,
memory and runtime), the rule's layers are the layers the policy keeps on the GPU, no options
(and a note) for a model it does not run, its error band from its own published rows, and the
CLI's line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moesim.sim.cli.main import main
from moesim.sim.study import advise_ktransformers as kt
from moesim.sim.study.advise import AdviseRequest, bands, build, caveats
from moesim.sim.study.advise_bands import catalog_band, load_table
from moesim.sim.study.advise_options import GIB, Memory, Shape, all_options, ktransformers_options

# DeepSeek-V2-Lite's family, hand-sized: 4 MoE layers after 1 dense block, 16 experts of 100 B
SHAPE = Shape("deepseek-v2-lite", 4, 16, 100, 0, 16, dense_blocks=1)


def test_options_on_a_hand_sized_model() -> None:
    """Room for 2 layers' experts (32) on a 2-socket host: every expert on the CPU (one expert of
    budget, the simulator's least), then the last 1 and 2 MoE layers (blocks 4, then 3-4) on the
    GPU without the CUDA graph; the host holds the CPU layers' experts twice (USE_NUMA=1)."""
    mem = Memory(vram_gib=32 * 100 / GIB, host_gib=1.0, reserve_gib=0, host_reserve_gib=0, numa_nodes=2)
    opts = ktransformers_options(SHAPE, mem)
    assert [(o.params, o.gpu_experts, o.host_bytes) for o in opts] == [
        ({"cpu_moe": True, "dense_blocks": 1, "op_offload_min_batch": 0}, 1, 4 * 16 * 100 * 2),
        ({"n_cpu_moe": 4, "dense_blocks": 1, "op_offload_min_batch": 0}, 16, 3 * 16 * 100 * 2),
        ({"n_cpu_moe": 3, "dense_blocks": 1, "op_offload_min_batch": 0}, 32, 2 * 16 * 100 * 2)]
    assert [o.setting for o in opts] == [
        "default rules (DeepSeek-V2-Chat.yaml: every routed expert on the CPU)",
        '--use_cuda_graph False; first in DeepSeek-V2-Chat.yaml: match name "^model\\\\.layers\\\\.(4)\\\\.mlp'
        '\\\\.experts$", generate_device "cuda", generate_op "KExpertsMarlin"',
        '--use_cuda_graph False; first in DeepSeek-V2-Chat.yaml: match name "^model\\\\.layers\\\\.([3-4])\\\\.mlp'
        '\\\\.experts$", generate_device "cuda", generate_op "KExpertsMarlin"']
    assert [o.runtime_ref for o in opts] == ["ktransformers-v0.2",
                                             {"base": "ktransformers-v0.2", **kt.EAGER_RUNTIME},
                                             {"base": "ktransformers-v0.2", **kt.EAGER_RUNTIME}]
    assert {(o.system, o.policy, o.band_system) for o in opts} == {("ktransformers", "cpu-moe", "ktransformers")}
    assert [round(o.vram_gib * GIB) for o in opts] == [100, 1600, 3200]
    one_socket = ktransformers_options(SHAPE, Memory(32 * 100 / GIB, 1.0, 0, 0))
    assert [o.host_bytes for o in one_socket] == [4 * 16 * 100, 3 * 16 * 100, 2 * 16 * 100]


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_the_rule_names_the_layers_the_policy_keeps_on_the_gpu(m: int) -> None:
    from policies.llamacpp.placement import cpu_layers

    shape = Shape("deepseek-v3", 58, 4, 100, 0, 16, dense_blocks=3)
    mem = Memory(vram_gib=4 * 4 * 100 / GIB, host_gib=1.0, reserve_gib=0, host_reserve_gib=0)   # room for 4 layers
    (opt,) = [o for o in ktransformers_options(shape, mem) if o.gpu_experts == m * 4]
    on_cpu = cpu_layers(58, dense_blocks=3, n_cpu_moe=opt.params["n_cpu_moe"])
    pattern = re.search(r'match name "(.*?)"', opt.setting)
    assert pattern is not None
    rule = pattern.group(1).replace("\\\\", "\\")   # as YAML's double quotes read it
    gpu_blocks = {b for b in range(61) if re.fullmatch(rule, f"model.layers.{b}.mlp.experts")}
    assert gpu_blocks == {layer + 3 for layer in range(58) if layer not in on_cpu}
    assert len(gpu_blocks) == m


@given(st.integers(0, 150), st.integers(0, 60))
def test_layer_regex_matches_exactly_the_range(first: int, span: int) -> None:
    last = first + span
    rx = kt.layer_regex(first, last)
    assert {n for n in range(0, 260) if re.fullmatch(f"({rx})", str(n))} == set(range(first, last + 1))


def test_layer_regex_as_the_rule_files_write_it() -> None:
    assert kt.layer_regex(55, 60) == "5[5-9]|60"
    assert kt.layer_regex(4, 8) == "[4-8]"


def test_only_the_models_it_runs() -> None:
    assert kt.rules_file("deepseek-v3-q4km") == "DeepSeek-V3-Chat.yaml"
    assert kt.rules_file("deepseek-v2.5") == kt.rules_file("deepseek-v2-lite") == "DeepSeek-V2-Chat.yaml"
    assert kt.rules_file("qwen2-57b-a14b") == "Qwen2-57B-A14B-Instruct.yaml"
    assert kt.rules_file("mixtral-8x7b-hqq-a4e2") == kt.rules_file("mixtral-8x22b") == "Mixtral.yaml"
    for other in ("deepseek-v3.2-q8_0", "qwen3-30b-a3b", "tiny-moe", "olmoe-1b-7b", "qwen1.5-moe-a2.7b"):
        assert kt.rules_file(other) is None
    tiny = Shape("tiny-moe", 4, 16, 100, 0, 16)
    mem = Memory(vram_gib=64 * 100 / GIB, host_gib=1.0, reserve_gib=0, host_reserve_gib=0)
    assert ktransformers_options(tiny, mem) == [] and all_options(tiny, mem, ["ktransformers"]) == []
    assert kt.unsupported_note("tiny-moe").startswith("kTransformers: no options for tiny-moe: local_chat runs")
    assert "doc/en/install.md 'Supported models'" in kt.unsupported_note("tiny-moe")
    assert "balance_serve" in kt.unsupported_note("qwen3-30b-a3b")


def test_its_band_is_its_own_published_rows() -> None:
    """Not llama.cpp's (its policy's) nor the SOSP '25 artifact's (runtime ktransformers-sosp25):
    the rows predicted with the runtime its options run, ktransformers-v0.2, of which none are on
    HBM GPUs (said), and they are said."""
    req = AdviseRequest(model="deepseek-v2.5", gpu="a100-pcie-40gb", vram_gib=38, host_gib=900,
                        cpu="xeon-platinum-8452y-2s", bits=[16.0], systems=["ktransformers", "cpu-moe"])
    _, options, _, _ = build(req)
    assert {o.runtime for o in options if o.system == "ktransformers"} == {kt.RUNTIME}
    got, _ = bands(req, options, 1555.0)
    mine = {b for o, b in zip(options, got, strict=True) if o.system == "ktransformers"}
    llama = {b for o, b in zip(options, got, strict=True) if o.system == "llama.cpp"}
    assert mine == {catalog_band("ktransformers", "ktransformers", "hbm", runtime=kt.RUNTIME)} and not mine & llama
    (band,) = mine
    rows = [r for r in load_table() if r["system"] == "ktransformers" and r["runtime"] == kt.RUNTIME
            and r["prediction"] == "catalog" and r["counted"] == "yes"]
    assert {r["gpu_class"] for r in rows} == {"gddr"} and {r["set"] for r in rows} == {"ktransformers-epyc9654-deepseek-r1"}
    assert band.rows == len(rows) == 2 and (band.lo, band.hi) == (min(float(r["speed_ratio"]) for r in rows),
                                                                  max(float(r["speed_ratio"]) for r in rows))
    assert band.words == ("on 2 published ktransformers rows run as ktransformers-v0.2, none on HBM data-centre GPUs "
                          "(theirs: GDDR GPUs)")
    assert catalog_band("ktransformers", "ktransformers", "hbm").rows == 3   # the artifact's, without the runtime
    assert kt.band_sets("hbm") == kt.band_sets("gddr") == (["ktransformers-epyc9654-deepseek-r1"], True)
    assert kt.band_sets("hbm", None) == (["ktransformers-sosp25-decode"], False)
    assert kt.band_sets("hbm", "hf-eager") == (["ktransformers-sosp25-decode"], False)
    # the 2-socket host: each option's host memory holds two copies of its CPU experts
    all_cpu = next(o for o in options if o.system == "ktransformers" and o.params.get("cpu_moe"))
    assert all_cpu.host_bytes == 2 * all_cpu.shape.routed_bytes


def test_caveats_and_the_note(tmp_path: Path) -> None:
    from moesim.sim.config.catalog import get_hardware

    cpu = get_hardware({"base": "a100-pcie-40gb", "cpu": "xeon-platinum-8452y-2s"}).cpu
    req = AdviseRequest(model="deepseek-v2.5", gpu="a100-pcie-40gb", vram_gib=38, host_gib=900,
                        cpu="xeon-platinum-8452y-2s", bits=[16.0], systems=["ktransformers"])
    from moesim.sim.study.advise import Row

    _, options, _, _ = build(req)
    lines = caveats(req, [Row(o, 1.0, "ok") for o in options], cpu, "hbm")
    assert any("--cpu_infer 73" in c and "USE_NUMA=1" in c and "AMX" in c for c in lines)
    assert any("4-bit Marlin" in c for c in lines)
    assert "kTransformers' error band comes from the published rows of ktransformers-epyc9654-deepseek-r1 (measurements/)" \
        in lines
    assert not any("predicted with runtime" in c or "sosp25" in c for c in lines)
    assert not any("no options" in c for c in lines)
    tiny = AdviseRequest(model="tiny-moe", gpu="rtx-4090", vram_gib=1.0, host_gib=1.0, reserve_gib=0.0, host_reserve_gib=0.0,
                         bits=[16.0], systems=["lru"])
    _, tiny_opts, _, _ = build(tiny)
    assert not any("kTransformers" in c for c in caveats(tiny, [Row(o, 1.0, "ok") for o in tiny_opts], cpu))
    tiny.systems = None
    _, tiny_opts, _, _ = build(tiny)
    assert [c for c in caveats(tiny, [Row(o, 1.0, "ok") for o in tiny_opts], cpu) if "kTransformers" in c] \
        == [kt.unsupported_note("tiny-moe")]


def test_cli_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["advise", "--model", "deepseek-v2-lite", "--gpu", "rtx-4090", "--vram", "4", "--host-mem", "40",
                 "--reserve", "0", "--host-reserve", "0", "--tokens", "4", "--jobs", "1", "--no-progress",
                 "--systems", "ktransformers", "--bits", "16", "--cpu", "epyc-genoa-12ch", "--out", str(tmp_path / "o")])
    out, _ = capsys.readouterr()
    assert code == 0
    assert ("best at 16 bits: ktransformers, default rules (DeepSeek-V2-Chat.yaml: every routed expert on the CPU): "
            in out)
    assert "caveat: kTransformers is priced as its V0.2 local_chat" in out and "--cpu_infer 97" in out
    v02 = catalog_band("ktransformers", "ktransformers", "gddr", runtime=kt.RUNTIME)
    assert f"({v02.lo:.2f}-{v02.hi:.2f}x on 2 published ktransformers rows run as ktransformers-v0.2 on GDDR GPUs)" in out
    csv = (tmp_path / "o" / "advise.csv").read_text().splitlines()
    assert any(line.startswith("ktransformers,default rules (DeepSeek-V2-Chat.yaml: every routed expert on the CPU)")
               for line in csv)


def test_a_supported_model_that_does_not_fit_says_what_it_needs() -> None:
    """Room for llama.cpp but not for two copies of every expert (USE_NUMA=1 on two sockets): the
    line gives the default rules' need (one expert of budget: 100 B of VRAM; 2 x 6400 B of host)."""
    from moesim.sim.study.advise_options import llamacpp_options

    mem = Memory(vram_gib=32 * 100 / GIB, host_gib=5000 / GIB, reserve_gib=0, host_reserve_gib=0, numa_nodes=2)
    assert ktransformers_options(SHAPE, mem)[0].fits() is False
    llama = [o for o in llamacpp_options(SHAPE, mem) if o.fits()]
    assert llama and not [o for o in all_options(SHAPE, mem, ["ktransformers"])]
    note = kt.shortfall_note(llama)
    assert note == (f"kTransformers: no option fits: at 16 bits its default rules need {100 / GIB:.1f} GiB of VRAM and "
                    f"{12800 / GIB:.1f} GiB of host memory (reserves included, 2 copies of the experts: one per NUMA "
                    f"node, USE_NUMA=1); given {32 * 100 / GIB:g} and {5000 / GIB:g}")
    assert kt.shortfall_note([]) is None and kt.shortfall_note(ktransformers_options(SHAPE, Memory(1, 1, 0, 0))) is None


def test_a_user_runtime_keeps_the_settings_eager_launches(tmp_path: Path) -> None:
    """--runtime FILE replaces the catalog runtime of every option, but a setting that changes its
    runtime still changes the user's: kTransformers' GPU expert layers run without the CUDA graph
    (its docs' --use_cuda_graph False) on the user's runtime too; the default rules keep it whole."""
    from moesim.sim.config.scenario import load_scenario_data
    from moesim.sim.study.advise import to_sweep

    rt = tmp_path / "rt.yaml"
    rt.write_text("name: mine\nlayer_us: 7\ncuda_graphs: true\n")
    req = AdviseRequest(model="deepseek-v2-lite", gpu="rtx-4090", vram_gib=8, host_gib=40, reserve_gib=0.0,
                        host_reserve_gib=0.0, bits=[16.0], systems=["ktransformers"], runtime=str(rt))
    base, options, _, _ = build(req)
    sweep = to_sweep(req, base, options)
    runtimes = [load_scenario_data(p.data, source="test", base_dir=tmp_path).runtime_spec() for p in sweep.points]
    assert len(runtimes) > 1 and {r.name for r in runtimes} == {"mine"} and {r.layer_us for r in runtimes} == {7}
    assert [r.cuda_graphs for r in runtimes] == [not o.runtime_overrides for o in options]
    assert [r.launch_us for r in runtimes] == [kt.EAGER_RUNTIME["launch_us"] if o.runtime_overrides else 0.0
                                               for o in options]
    from moesim.sim.study.advise_calibration import calibration_lines

    said = [line for line in calibration_lines(req, base, options) if "where a setting says so" in line]
    assert said == [f"  with {kt.EAGER_RUNTIME} where a setting says so (kTransformers' experts on the GPU, "
                    "--use_cuda_graph False: sim/study/advise_ktransformers.py)"]
