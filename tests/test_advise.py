"""``simctl advise``: every option fits the memory, the best is on the Pareto front, a second
run reuses the points, bad input is one line; the option arithmetic on a hand-sized model."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.sim.cli.main import main
from moesim.sim.study.advise import (
    AdviseRequest,
    Row,
    build,
    likely_speed,
    mark,
    pareto,
    run_advice,
    widths,
)
from moesim.sim.study.advise_bands import Band
from moesim.sim.study.advise_options import (
    GIB,
    UNMERGED_HOT_CACHE,
    Memory,
    Shape,
    all_options,
    llamacpp_flags,
    llamacpp_options,
    steps,
)

# tiny-moe: 4 layers x 16 experts of 3 x 128 x 128 x 2 B = 98,304 B; 543,488 B of other weights
TINY_VRAM = (543_488 + 20 * 98_304) / GIB      # the non-expert weights and 20 experts, no reserve
TINY = AdviseRequest(model="tiny-moe", gpu="rtx-4090", vram_gib=TINY_VRAM, host_gib=0.01, reserve_gib=0.0,
                     host_reserve_gib=0.0, decode_tokens=8, bits=[16.0])


def test_options_fit_and_best_on_front(tmp_path: Path) -> None:
    advice = run_advice(TINY, tmp_path / "a", jobs=1)
    assert advice.ok() and len(advice.ok()) == len(advice.rows)
    assert {r.option.system for r in advice.rows} == {"expert cache (lru)", "mixtral-offloading", "llama.cpp",
                                                       "fiddler", "accelerate"}
    for r in advice.rows:
        assert r.option.vram_gib <= TINY.vram_gib + 1e-12
        assert r.option.host_gib <= TINY.host_gib
        assert r.option.gpu_experts <= 20
    (best,) = advice.best()
    assert best.pareto
    assert best.tokens_per_s == max(r.tokens_per_s or 0.0 for r in advice.rows)
    assert all(r.band is not None for r in advice.rows)
    assert any(c.startswith("host assumed: 16 cores, 80 GB/s") for c in advice.caveats)


def test_resumed_run_reuses_points(tmp_path: Path) -> None:
    first = run_advice(TINY, tmp_path / "a", jobs=1)
    again = run_advice(TINY, tmp_path / "a", jobs=1)
    assert first.points_run == len(first.rows) and first.points_reused == 0
    assert again.points_run == 0 and again.points_reused == len(again.rows)
    assert [r.tokens_per_s for r in again.rows] == [r.tokens_per_s for r in first.rows]


def test_llamacpp_arithmetic() -> None:
    """4 layers x 16 experts, room for 12 experts: --n-cpu-moe 4 is the least that fits (3 would
    need 16); it takes one expert of room (the simulator's least budget); hot caches of 2, 4 and
    8 slots over 4 CPU layers need 8, 16, 32."""
    shape = Shape("t", 4, 16, 100, 0, 16)
    mem = Memory(vram_gib=12 * 100 / GIB, host_gib=1.0, reserve_gib=0, host_reserve_gib=0)
    opts = llamacpp_options(shape, mem)
    assert [(o.params["n_cpu_moe"], o.params["hot_cache_slots"], o.gpu_experts) for o in opts] == [(4, 0, 1), (4, 2, 8)]
    assert opts[0].host_bytes == 4 * 16 * 100


def test_steps() -> None:
    assert steps(1, 4) == [1, 2, 3, 4]
    assert steps(0, 70, 8) == [0, 10, 20, 30, 40, 50, 60, 70]
    assert steps(5, 4) == []


@settings(max_examples=60, deadline=None)
@given(L=st.integers(1, 8), E=st.integers(2, 16), room=st.integers(0, 200), host=st.integers(0, 200))
def test_every_option_fits(L: int, E: int, room: int, host: int) -> None:
    shape = Shape("t", L, E, 1000, 500, 16)
    mem = Memory(vram_gib=(500 + room * 1000) / GIB, host_gib=host * 1000 / GIB, reserve_gib=0, host_reserve_gib=0)
    for o in all_options(shape, mem):
        assert o.gpu_experts <= room and o.host_bytes <= host * 1000 + 1e-6


@given(st.lists(st.tuples(st.integers(1, 50), st.floats(0.01, 100)), min_size=1, max_size=12))
def test_pareto_front(points: list[tuple[int, float]]) -> None:
    """No row strictly beats a front row (less or equal VRAM and more or equal speed, one of
    them strictly); every row off the front is matched or beaten by another row."""
    from moesim.sim.study.advise_options import Option

    mem = Memory(1000, 1000, 0, 0)
    rows = [Row(Option("s", "lru", {}, "", n, Shape("t", 1, 2, GIB, 0, 16), 0, "none", mem), tps, "ok")
            for n, tps in points]
    front = pareto(rows)

    def key(r: Row) -> tuple[float, float]:
        return r.option.vram_gib, r.tokens_per_s or 0.0

    for r in rows:
        v, t = key(r)
        if any(r is f for f in front):
            assert not any(key(o)[0] <= v and key(o)[1] >= t and key(o) != (v, t) for o in rows)
        else:
            assert any(o is not r and key(o)[0] <= v and key(o)[1] >= t for o in rows)


def test_nothing_fits_names_the_need() -> None:
    req = AdviseRequest(model="tiny-moe", gpu="rtx-4090", vram_gib=0.0001, host_gib=1.0, reserve_gib=0.0,
                        bits=[16.0])
    with pytest.raises(Exception, match="nothing fits 0.0001 GiB of VRAM.*needs at least"):
        build(req)


@pytest.mark.parametrize("args, needle", [
    (["--gpu", "rtx-409", "--vram", "24"], "--gpu rtx-409: not in the hardware catalog"),
    (["--gpu", "rtx-4090", "--vram", "0.0001"], "nothing fits 0.0001 GiB of VRAM"),
    (["--gpu", "rtx-4090", "--vram", "-1"], "--vram -1: must be a positive number"),
    (["--gpu", "rtx-4090", "--vram", "24", "--cpu", "ddr9"], "--cpu ddr9: not in the host catalog"),
])
def test_bad_input_is_one_line(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["advise", "--model", "tiny-moe", "--host-mem", "8", "--reserve", "0", *args])
    _, err = capsys.readouterr()
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], err


@pytest.mark.parametrize("flag, text, needle", [
    ("--runtime", "name: mine\nlayer_us: -3\n", "--runtime {f}: layer_us: Input should be greater than or equal to 0"),
    ("--gpu", "name: mine\npcie_gbps: -1\n", "--gpu {f}: pcie_gbps: Input should be greater than 0"),
])
def test_a_bad_spec_file_is_one_line_naming_it_before_any_run(tmp_path: Path, flag: str, text: str, needle: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A --runtime or --gpu file with a field out of range is refused up front, naming the file
    (the runtime file was checked only after every option had been simulated, and neither line
    named the file); nothing is written."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    gpu = [] if flag == "--gpu" else ["--gpu", "rtx-4090"]
    code = main(["advise", "--model", "tiny-moe", "--vram", "1", "--host-mem", "8", "--reserve", "0", *gpu,
                 flag, str(spec), "--jobs", "1", "--no-progress", "--out", str(tmp_path / "o")])
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and needle.format(f=spec) in lines[0], err
    assert not (tmp_path / "o").exists()


def test_cli_writes_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["advise", "--model", "tiny-moe", "--gpu", "rtx-4090", "--vram", str(TINY_VRAM), "--host-mem", "1",
                 "--reserve", "0", "--host-reserve", "0", "--tokens", "8", "--jobs", "1", "--no-progress",
                 "--systems", "lru,cpu-moe", "--bits", "16", "--cpu", "epyc-genoa-12ch", "--out", str(tmp_path / "o")])
    out, _ = capsys.readouterr()
    assert code == 0
    assert " at 16 bits" in out and "calibration:" in out and "workload:" in out
    assert "host assumed" not in out
    for name in ("advise.csv", "advise.md", "advise.png", "advise.svg"):
        assert (tmp_path / "o" / name).stat().st_size > 0
    csv = (tmp_path / "o" / "advise.csv").read_text().splitlines()
    assert csv[0].startswith("system,setting,bits,vram_gib")
    assert {line.split(",")[0] for line in csv[1:]} == {"expert cache (lru)", "llama.cpp"}
    assert all("published llama.cpp rows" in line for line in csv[1:] if line.startswith("llama.cpp"))  # its band


def test_every_width_considered_by_default() -> None:
    """Without --bits: the model's own width and Q8_0's and Q4_K's sizes below it, each with its memory."""
    req = AdviseRequest(model="tiny-moe", gpu="rtx-4090", vram_gib=TINY_VRAM, host_gib=0.01, reserve_gib=0.0,
                        host_reserve_gib=0.0, systems=["lru"])
    _, options, _, notes = build(req)
    assert sorted({o.shape.bits for o in options}) == [4.5, 8.5, 16.0]
    assert [n.split(":")[0] for n in notes[:3]] == ["at 16 bits per weight (the model's own)",
                                                    "at 8.5 bits per weight (the size of llama.cpp's Q8_0)",
                                                    "at 4.5 bits per weight (the size of llama.cpp's Q4_K)"]
    assert widths(8.5, None) == [None, 4.5] and widths(16, [16.0]) == [16.0]


def test_llamacpp_flag_counts_dense_blocks() -> None:
    """llama.cpp's --n-cpu-moe N moves blocks 0..N-1 (common/arg.cpp: one override per block index):
    DeepSeek-V2-Lite's dense first block counts, so n MoE layers on the CPU print as n + 1, and the
    policy gets both (it places the same n layers)."""
    from moesim.sim.config.catalog import get_model

    m = get_model("deepseek-v2-lite")
    assert m.dense_blocks == 1 and "dense_blocks" not in m.model_dump()
    shape = Shape("deepseek-v2-lite", 26, 64, 100, 0, 16, dense_blocks=1)
    mem = Memory(vram_gib=64 * 100 / GIB, host_gib=1.0, reserve_gib=0, host_reserve_gib=0)
    opts = llamacpp_options(shape, mem)
    assert {(o.params["n_cpu_moe"], o.params["dense_blocks"], o.setting) for o in opts if not o.unmerged} \
        == {(26, 1, "-ngl 99 --n-cpu-moe 26"), (27, 1, "-ngl 99 --n-cpu-moe 27")}
    assert llamacpp_flags(Shape("m", 4, 8, 1, 0, 16), 3, 2) == "-ngl 99 --n-cpu-moe 3 --moe-expert-cache 2"


def test_cpu_moe_places_the_same_layers_with_dense_blocks() -> None:
    from policies.llamacpp.placement import cpu_layers

    assert cpu_layers(26, dense_blocks=1, n_cpu_moe=5) == cpu_layers(26, n_cpu_moe=4)


def test_unmerged_marked_and_left_out_with_merged_only() -> None:
    shape = Shape("t", 4, 16, 100, 0, 16)
    mem = Memory(vram_gib=40 * 100 / GIB, host_gib=1.0, reserve_gib=0, host_reserve_gib=0)
    hot = [o for o in llamacpp_options(shape, mem) if o.params["hot_cache_slots"]]
    assert hot and all(o.unmerged == UNMERGED_HOT_CACHE and "--moe-expert-cache" in o.setting for o in hot)
    assert "PR #27861" in UNMERGED_HOT_CACHE and "open" in UNMERGED_HOT_CACHE
    assert not any(o.unmerged for o in all_options(shape, mem, merged_only=True))
    assert [o for o in all_options(shape, mem, merged_only=True) if o.policy == "cpu-moe"]


def _row(tps: float, band: Band | None) -> Row:
    from moesim.sim.study.advise_options import Option

    mem = Memory(1000, 1000, 0, 0)
    return Row(Option("s", "lru", {}, "", 1, Shape("t", 1, 2, GIB, 0, 16), 0, "none", mem), tps, "ok", band=band)


def test_ties_within_the_error_bands() -> None:
    """Best 10 with band 0.5-1.0x may stand for 10-20; 6 at 0.5-1.0x for 6-12 (a tie); 4 for 4-8
    (not). Without bands 1% either way: 9.95 ties with 10, 9.7 does not."""
    band = Band(0.5, 1.0, 3, "on 3 rows")
    rows = [_row(10, band), _row(6, band), _row(4, band)]
    mark(rows)
    assert [r.mark() for r in rows] == ["tie, fastest", "tie", ""]   # one VRAM: only the fastest on the front
    bare = [_row(10, None), _row(9.95, None), _row(9.7, None)]
    mark(bare)
    assert [(r.best, r.tie) for r in bare] == [(True, True), (False, True), (False, False)]
    alone = [_row(10, None), _row(9.0, None)]
    mark(alone)
    assert alone[0].mark() == "best"


def test_best_is_what_the_bands_say_not_the_most_optimistic_prediction() -> None:
    """A system whose published rows came out 2.10-2.64x too fast (4.39 may stand for 1.66-2.09)
    is not the fastest against one at 1.02-1.47x (4.11 stands for 2.80-4.03): the second is
    best, and the first does not even tie. Equal bands keep the order of the predictions."""
    rows = [_row(4.39, Band(2.10, 2.64, 3, "on 3 rows")), _row(4.11, Band(1.02, 1.47, 5, "on 5 rows"))]
    mark(rows)
    assert [(r.best, r.tie) for r in rows] == [(False, False), (True, False)]
    assert likely_speed(rows[1]) == pytest.approx(4.11 / (1.02 * 1.47) ** 0.5)
    same = Band(0.8, 1.2, 4, "on 4 rows")
    even = [_row(5.0, same), _row(6.0, same)]
    mark(even)
    assert [r.best for r in even] == [False, True]
    assert likely_speed(_row(7.0, None)) == pytest.approx(7.0)


def test_model_file_and_inline_spec(tmp_path: Path) -> None:
    spec = tmp_path / "my-moe.yaml"
    spec.write_text("model: {base: tiny-moe, num_layers: 2, dense_blocks: 1}\n")
    for model in (str(spec), "{base: tiny-moe, num_layers: 2, dense_blocks: 1}"):
        req = AdviseRequest(model=model, gpu="rtx-4090", vram_gib=TINY_VRAM, host_gib=0.01, reserve_gib=0.0,
                            host_reserve_gib=0.0, bits=[16.0], systems=["cpu-moe"])
        base, options, _, _ = build(req)
        assert base["model"]["num_layers"] == 2 and "dense_blocks" not in base["model"]
        assert {o.shape.num_layers for o in options} == {2} and all(o.shape.dense_blocks == 1 for o in options)
        assert base["trace"]["synthetic"]["num_layers"] == 2


def test_a_model_spec_keeps_its_attention_shape() -> None:
    """The attention shape is left out of a model's dumps; a spec given to advise keeps it, so
    --context and kTransformers' eager attention can price it (they failed on it before)."""
    from moesim.sim.config.catalog import get_model
    from moesim.sim.study.advise_inputs import model_ref

    ref, _ = model_ref("{base: deepseek-v2.5, num_layers: 20}")
    spec = {k: v for k, v in ref.items() if k != "dense_blocks"}
    assert get_model(spec).kv_bytes_per_token == get_model("deepseek-v2.5").kv_bytes_per_token == 1152
    req = AdviseRequest(model="{base: deepseek-v2.5, num_layers: 20}", gpu="a100-pcie-40gb", vram_gib=38,
                        host_gib=900, bits=[16.0], systems=["cpu-moe"], context_tokens=4096)
    base, _, _, _ = build(req)
    assert base["model"]["kv_lora_rank"] == get_model("deepseek-v2.5").kv_lora_rank


def test_model_spec_runs(tmp_path: Path) -> None:
    req = AdviseRequest(model="{base: tiny-moe, num_layers: 2}", gpu="rtx-4090", vram_gib=TINY_VRAM, host_gib=0.01,
                        reserve_gib=0.0, host_reserve_gib=0.0, bits=[16.0], systems=["lru"], decode_tokens=4)
    advice = run_advice(req, tmp_path / "a", jobs=1)
    assert advice.ok() and advice.model_name == "tiny-moe-custom"


@pytest.mark.parametrize("model, needle", [
    ("{num_layers: 2}", "--model (inline): "),
    ("{base: tiny-moe, num_layers: -2}", "--model (inline): "),
    ("{base: tiny-moe", "--model {base: tiny-moe: not an inline YAML mapping"),
    ("nope.yaml", "--model nope.yaml: no such file"),
    ("tiny-mo", "did you mean 'tiny-moe'?"),
])
def test_bad_model_spec_is_one_line(model: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["advise", "--model", model, "--gpu", "rtx-4090", "--vram", "24", "--host-mem", "8"])
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and needle in lines[0], err


def test_a_model_name_is_printed_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A name from the user's spec is text, not rich markup."""
    code = main(["advise", "--model", "{base: tiny-moe, name: '[bold]my-moe'}", "--gpu", "rtx-4090", "--vram",
                 str(TINY_VRAM), "--host-mem", "1", "--reserve", "0", "--host-reserve", "0", "--tokens", "4",
                 "--jobs", "1", "--no-progress", "--systems", "lru", "--bits", "16"])
    out, _ = capsys.readouterr()
    assert code == 0 and "[bold]my-moe on rtx-4090" in out


def test_unmerged_rows_are_marked_in_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["advise", "--model", "tiny-moe", "--gpu", "rtx-4090", "--vram", "0.003", "--host-mem", "1", "--reserve",
            "0", "--host-reserve", "0", "--tokens", "4", "--jobs", "1", "--no-progress", "--systems", "cpu-moe",
            "--bits", "16", "--all"]
    assert main(args) == 0
    out = capsys.readouterr().out
    # the fastest (printed in full below the table): 3 CPU layers, each paying llama.cpp's CPU/GPU hand-off
    assert "--n-cpu-moe 3 --moe-expert-cache 2 [unmerged]" in out and "caveat: unmerged upstream: 3 options" in out
    assert "caveat: llama.cpp loads by mmap unless --no-mmap" in out   # its copies priced pageable
    assert main([*args, "--merged-only"]) == 0
    out = capsys.readouterr().out
    assert "--moe-expert-cache" not in out.split("caveat:")[0] and "caveat: --merged-only" in out


def test_the_table_and_the_headline_round_memory_alike() -> None:
    """8.749 GiB of host memory reads 8.7 in the headline, the table and advise.md alike (the table
    once rounded the CSV's 2-decimal 8.75 again, to 8.8)."""
    import io

    from rich.console import Console

    from moesim.sim.study.advise import Advice, AdviseRequest, Row
    from moesim.sim.study.advise_options import Option
    from moesim.sim.study.advise_report import headline, markdown, print_report

    shape = Shape("m", 2, 4, GIB, 0, 16)
    mem = Memory(vram_gib=24.0, host_gib=20.0, reserve_gib=0.0, host_reserve_gib=0.0)
    option = Option("llama.cpp", "cpu-moe", {}, "-ngl 99 --n-cpu-moe 1", 4, shape, 8.749 * GIB, "llama-cpp-like", mem)
    advice = Advice([Row(option, 10.0, "ok", best=True)], [], "w", model_name="m")
    req = AdviseRequest(model="m", gpu="rtx-4090", vram_gib=24.0, host_gib=20.0)
    assert "4.0 of 24 GiB VRAM, 8.7 of 20 GiB host" in headline(req, advice)[0]
    assert "| 4.0 | 8.7 |" in markdown(req, advice)
    buf = io.StringIO()
    print_report(req, advice, Console(file=buf, width=200))
    assert "│ 8.7 " in buf.getvalue() and "8.8" not in buf.getvalue()
