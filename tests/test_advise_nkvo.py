"""``simctl advise`` offers llama.cpp's ``-nkvo`` (the KV cache in host memory, attention on the
CPU) where it changes what fits: none without ``--context``; with a KV cache that frees a whole
layer of experts, options whose VRAM leaves the KV cache out and whose host memory counts it,
reaching fewer ``--n-cpu-moe`` layers; the scenario it simulates keeps the KV cache on the host
(and pays for it); its band keeps to the published rows that ran ``-nkvo``; its caveat says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from moesim.sim.cli.main import main
from moesim.sim.config.scenario import load_scenario_data
from moesim.sim.study.advise import AdviseRequest, build, run_advice, to_sweep
from moesim.sim.study.advise_bands import catalog_band
from moesim.sim.study.advise_options import (
    GIB,
    HOST_KV_RUNTIME,
    Memory,
    Shape,
    all_options,
    least_needed,
    llamacpp_options,
)

# tiny-moe: 4 MoE layers x 16 experts of 98,304 B, 543,488 B of other weights, 256 B of KV cache a
# token in each of its 4 attention blocks: 1,024 B a token, so (760 + 8) tokens hold 8 experts' bytes
EXPERT, OTHER = 98_304, 543_488
ROOM32 = (OTHER + 32 * EXPERT) / GIB        # the other weights and 32 experts, no reserve


def _req(context: int, **kw: object) -> AdviseRequest:
    args: dict = {"model": "tiny-moe", "gpu": "rtx-4090", "vram_gib": ROOM32, "host_gib": 1.0, "reserve_gib": 0.0,
                  "host_reserve_gib": 0.0, "decode_tokens": 8, "bits": [16.0], "systems": ["cpu-moe"],
                  "context_tokens": context, **kw}
    return AdviseRequest(**args)


def _key(o) -> tuple:  # type: ignore[no-untyped-def]
    return o.params["n_cpu_moe"], o.params["hot_cache_slots"], o.gpu_experts, o.kv_on_host


def test_no_context_no_nkvo() -> None:
    """Without --context there is no KV cache to move: the options are as they always were."""
    _, options, _, _ = build(_req(0, systems=None))
    assert options and not any(o.kv_on_host or "-nkvo" in o.setting or o.runtime_overrides == HOST_KV_RUNTIME
                               for o in options)
    shape = Shape("t", 4, 16, 100, 0, 16)
    assert not any(o.kv_on_host for o in llamacpp_options(shape, Memory(32 * 100 / GIB, 1.0, 0, 0)))


def test_nkvo_frees_a_layer_by_hand() -> None:
    """4 layers x 16 experts of 100 B, 3,200 B of VRAM, an 800 B KV cache (8 experts' worth).
    KV cache in VRAM: room for 24 experts, so --n-cpu-moe 3 is the least (2 would need 32); hot
    caches of 2 and 4 slots over 3 CPU layers need 22 and 28 (28 > 24: out), over 4 layers 8, 16
    and 32 (out). KV cache in host memory: room for 32, so --n-cpu-moe 2 fits; -nkvo is offered
    from 2 up to 3, the least without it, with no hot cache."""
    shape = Shape("t", 4, 16, 100, 0, 16)
    mem = Memory(vram_gib=3200 / GIB, host_gib=1.0, reserve_gib=0, host_reserve_gib=0, kv_gib=800 / GIB)
    opts = llamacpp_options(shape, mem)
    assert [_key(o) for o in opts] == [(3, 0, 16, False), (3, 2, 22, False), (4, 0, 1, False), (4, 2, 8, False),
                                        (4, 4, 16, False), (2, 0, 32, True), (3, 0, 16, True)]
    assert all_options(shape, mem, ["cpu-moe"]) == opts   # every one fits
    plain, nkvo = opts[0], opts[5]
    assert nkvo.setting == "-ngl 99 --n-cpu-moe 2 -nkvo" and opts[6].setting == "-ngl 99 --n-cpu-moe 3 -nkvo"
    assert nkvo.vram_gib * GIB == pytest.approx(3200)           # 32 experts, the KV cache not in VRAM
    assert nkvo.host_gib * GIB == pytest.approx(2 * 16 * 100 + 800)   # 2 CPU layers + the KV cache
    assert plain.vram_gib * GIB == pytest.approx(1600 + 800) and plain.host_gib * GIB == pytest.approx(4800)
    assert opts[6].vram_gib * GIB == pytest.approx(1600) and opts[6].host_gib * GIB == pytest.approx(4800 + 800)
    assert nkvo.runtime_ref == {"base": "llama-cpp-like", "kv_on_host": True}
    assert min(o.params["n_cpu_moe"] for o in opts if o.kv_on_host) < min(o.params["n_cpu_moe"] for o in opts
                                                                         if not o.kv_on_host)
    # the host must hold the KV cache too: 4,799 B of host memory fits --n-cpu-moe 3 without -nkvo only
    tight = Memory(vram_gib=3200 / GIB, host_gib=4799.5 / GIB, reserve_gib=0, host_reserve_gib=0, kv_gib=800 / GIB)
    assert [_key(o) for o in all_options(shape, tight, ["cpu-moe"]) if o.kv_on_host] == [(2, 0, 32, True)]


def test_nkvo_only_where_it_changes_what_fits() -> None:
    """4,000 B of VRAM: --n-cpu-moe 2 fits with the KV cache in VRAM (32 + 8 = 40 experts' room), and
    moving it frees no whole layer (48 would need 4,800): no -nkvo option. With no room at all for
    the KV cache beside the other weights, -nkvo is all there is, up to every layer on the CPU."""
    shape = Shape("t", 4, 16, 100, 0, 16)
    mem = Memory(vram_gib=4000 / GIB, host_gib=1.0, reserve_gib=0, host_reserve_gib=0, kv_gib=800 / GIB)
    assert not any(o.kv_on_host for o in llamacpp_options(shape, mem))
    full = Memory(vram_gib=800 / GIB, host_gib=1.0, reserve_gib=0, host_reserve_gib=0, kv_gib=800 / GIB)
    assert [_key(o) for o in llamacpp_options(shape, full)] == [(4, 0, 1, True)]
    # nothing else fits, and the least VRAM says the KV cache may live in host memory
    words = least_needed(shape, Memory(vram_gib=50 / GIB, host_gib=1.0, reserve_gib=0, host_reserve_gib=0,
                                       kv_gib=800 / GIB), host_kv=True)
    assert "+ 2 experts + 0 GiB reserve; the 0.00 GiB KV cache in host memory, llama.cpp's -nkvo)" in words


def test_the_scenario_keeps_the_kv_cache_on_the_host_and_pays_for_it(tmp_path: Path) -> None:
    """tiny-moe with 32 experts' room and (760 + 8) tokens of context: 8 experts of KV cache. The
    sweep point of a -nkvo option runs kv_on_host; every option simulates; at the same experts
    (--n-cpu-moe 3) -nkvo is slower (attention on the CPU), and it alone reaches --n-cpu-moe 2."""
    req = _req(760)
    base, options, _, _ = build(req)
    assert options[0].memory.kv_gib * GIB == pytest.approx(8 * EXPERT)
    sweep = to_sweep(req, base, options)
    for point, o in zip(sweep.points, options, strict=True):
        loaded = load_scenario_data(point.data, source="test", base_dir=tmp_path)
        assert loaded.runtime_spec().kv_on_host is o.kv_on_host
    assert {o.setting for o in options if o.kv_on_host} == {"-ngl 99 --n-cpu-moe 2 -nkvo", "-ngl 99 --n-cpu-moe 3 -nkvo"}
    advice = run_advice(req, tmp_path / "a", jobs=1)
    assert len(advice.ok()) == len(advice.rows) == len(options)
    speed = {r.option.setting: r.tokens_per_s or 0.0 for r in advice.rows}
    assert speed["-ngl 99 --n-cpu-moe 3 -nkvo"] < speed["-ngl 99 --n-cpu-moe 3"]
    nkvo = [r for r in advice.rows if r.option.kv_on_host]
    assert all(r.band is not None and "with the KV cache in host memory" in r.band.words for r in nkvo)
    (line,) = [c for c in advice.caveats if c.startswith("llama.cpp with -nkvo (2 options)")]
    assert "attention runs on the CPU" in line and "llama-bench takes -nkvo 1" in line
    assert "ktransformers-sosp25-decode" in line
    assert any("-nkvo options count the KV cache in host memory" in n for n in advice.notes)
    assert any("kv_on_host" in c and "-nkvo" in c for c in advice.calibration)


def test_a_user_runtime_keeps_its_fields_and_moves_the_kv_cache(tmp_path: Path) -> None:
    """--runtime FILE: every option runs it; the -nkvo ones with kv_on_host added to it."""
    rt = tmp_path / "rt.yaml"
    rt.write_text("name: mine\nlayer_us: 7\ncpu_switch_us: 40\n")
    req = _req(760, runtime=str(rt))
    base, options, _, _ = build(req)
    sweep = to_sweep(req, base, options)
    runtimes = [load_scenario_data(p.data, source="test", base_dir=tmp_path).runtime_spec() for p in sweep.points]
    assert [r.kv_on_host for r in runtimes] == [o.kv_on_host for o in options] and any(r.kv_on_host for r in runtimes)
    assert {(r.name, r.layer_us, r.cpu_switch_us) for r in runtimes} == {("mine", 7, 40)}


def test_the_nkvo_band_is_the_published_nkvo_rows() -> None:
    """The committed table's llama.cpp rows that kept the KV cache in host memory are the SOSP '25
    set's; a -nkvo option's band keeps to them (its GPU class's), the others' band is unchanged."""
    hbm = catalog_band("cpu-moe", "llama.cpp", "hbm", runtime="llama-cpp-like", host_kv=True)
    plain = catalog_band("cpu-moe", "llama.cpp", "hbm", runtime="llama-cpp-like")
    assert hbm.rows == 3 and (round(hbm.lo or 0, 3), round(hbm.hi or 0, 3)) == (1.046, 1.328)
    assert hbm.words == ("on 3 published llama.cpp rows run as llama-cpp-like with the KV cache in host memory on HBM "
                         "data-centre GPUs")
    assert plain.rows == 4 and "host memory" not in plain.words
    rows = ({"system": "cpu-moe", "gpu_class": "gddr", "speed_ratio": "1.1", "prediction": "catalog",
             "counted": "yes", "runtime": "llama-cpp-like", "kv_on_host": "no"},)
    other = catalog_band("cpu-moe", "llama.cpp", "gddr", rows, runtime="llama-cpp-like", host_kv=True)
    assert other.rows == 1 and other.words.endswith("; none with the KV cache in host memory")


def test_cli_prints_nkvo(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """simctl advise --context prints the -nkvo settings, ready to paste, and the caveat."""
    monkeypatch.setenv("COLUMNS", "200")   # the table's rows unwrapped
    code = main(["advise", "--model", "tiny-moe", "--gpu", "rtx-4090", "--vram", str(ROOM32), "--host-mem", "1",
                 "--reserve", "0", "--host-reserve", "0", "--tokens", "8", "--jobs", "1", "--no-progress",
                 "--systems", "cpu-moe", "--bits", "16", "--context", "760", "--all"])
    out = capsys.readouterr().out
    assert code == 0
    assert "--n-cpu-moe 2 -nkvo" in out and "caveat: llama.cpp with -nkvo (2 options)" in out
    code = main(["advise", "--model", "tiny-moe", "--gpu", "rtx-4090", "--vram", str(ROOM32), "--host-mem", "1",
                 "--reserve", "0", "--host-reserve", "0", "--tokens", "8", "--jobs", "1", "--no-progress",
                 "--systems", "cpu-moe", "--bits", "16", "--all"])
    assert code == 0 and "-nkvo" not in capsys.readouterr().out


def test_the_table_marks_the_rows_that_kept_the_kv_cache_on_the_host(tmp_path: Path) -> None:
    """Column kv_on_host: yes on exactly the SOSP '25 set's llama.cpp rows (run with -nkvo 1,
    runtime {base: llama-cpp-like, kv_on_host: true}); a runtime's overrides, file or entry decide."""
    from benchmarks.advise_bands import MEASUREMENTS, kv_on_host
    from moesim.sim.study.advise_bands import load_table

    yes = {(r["set"], r["system"], r["row"]) for r in load_table() if r["kv_on_host"] == "yes"}
    assert yes == {("ktransformers-sosp25-decode", "cpu-moe", str(i)) for i in range(9, 15)}
    assert kv_on_host("llama-cpp-like", MEASUREMENTS) == kv_on_host(None, MEASUREMENTS) == "no"
    assert kv_on_host({"base": "llama-cpp-like", "kv_on_host": True}, MEASUREMENTS) == "yes"
    (tmp_path / "rt.yaml").write_text("name: mine\nkv_on_host: true\n")
    assert kv_on_host("rt.yaml", tmp_path) == "yes"
    assert kv_on_host({"base": "rt.yaml", "kv_on_host": False}, tmp_path) == "no"


def test_the_caveat_reads_at_the_rate_of_the_runtime_the_options_run(tmp_path: Path) -> None:
    """On a two-socket host that gives numa_unaware_gbps, the -nkvo caveat's host rate is the one
    the options' runtime reads at: the catalog's llama-cpp-like (not NUMA-aware) or a --runtime
    file that is (it read the catalog runtime's figure whatever the file said)."""
    from moesim.sim.config.catalog import get_hardware
    from moesim.sim.study.advise import Row, caveats

    hw = get_hardware({"base": "rtx-4090", "cpu": "xeon-platinum-8452y-2s"})
    cpu = hw.cpu

    def rate(**kw: object) -> str:
        req = _req(760, cpu="xeon-platinum-8452y-2s", **kw)
        _, options, _, _ = build(req)
        line = next(c for c in caveats(req, [Row(o, 1.0, "ok") for o in options], cpu, "gddr", hw) if "-nkvo" in c)
        return line.split("at the host's ")[1].split(" GB/s")[0]

    assert rate() == f"{cpu.runtime_read_gbps(False):g}"
    aware = tmp_path / "aware.yaml"
    aware.write_text("name: mine\nnuma_aware: true\n")
    assert rate(runtime=str(aware)) == f"{cpu.runtime_read_gbps(True):g}"
    assert cpu.runtime_read_gbps(True) != cpu.runtime_read_gbps(False)
