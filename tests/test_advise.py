"""``simctl advise``: every option fits the memory, the best is on the Pareto front, a second
run reuses the points, bad input is one line; the option arithmetic on a hand-sized model."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.sim.cli.main import main
from moesim.sim.study.advise import AdviseRequest, Row, build, pareto, run_advice
from moesim.sim.study.advise_options import GIB, Memory, Shape, all_options, llamacpp_options, steps

# tiny-moe: 4 layers x 16 experts of 3 x 128 x 128 x 2 B = 98,304 B; 543,488 B of other weights
TINY_VRAM = (543_488 + 20 * 98_304) / GIB      # the non-expert weights and 20 experts, no reserve
TINY = AdviseRequest(model="tiny-moe", gpu="rtx-4090", vram_gib=TINY_VRAM, host_gib=0.01, reserve_gib=0.0,
                     host_reserve_gib=0.0, decode_tokens=8)


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


def test_cli_writes_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["advise", "--model", "tiny-moe", "--gpu", "rtx-4090", "--vram", str(TINY_VRAM), "--host-mem", "1",
                 "--reserve", "0", "--host-reserve", "0", "--tokens", "8", "--jobs", "1", "--no-progress",
                 "--systems", "lru,cpu-moe", "--out", str(tmp_path / "o")])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "best at 16 bits" in out and "calibration:" in out and "workload:" in out
    for name in ("advise.csv", "advise.md", "advise.png", "advise.svg"):
        assert (tmp_path / "o" / name).stat().st_size > 0
    csv = (tmp_path / "o" / "advise.csv").read_text().splitlines()
    assert csv[0].startswith("system,setting,bits,vram_gib")
    assert {line.split(",")[0] for line in csv[1:]} == {"expert cache (lru)", "llama.cpp"}
