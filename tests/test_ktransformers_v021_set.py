"""measurements/ktransformers-v021-deepseek-v3-context.yaml, the kTransformers tutorial's V0.2.1
table: the file loads as ``simctl fit`` reads it, every row's value is the number its source
quotes (a prefill row's time to the first token is the printed prompt length over the printed
rate), the row's prompt length is its source's column, and the roles follow the header's rule
(fit: 8 experts at the two shortest prompts; every other row held out). Schema, that every row
builds and that the source names an address and a place are tests/test_measurement_sets.py's and
tests/test_real_system_sets.py's."""

from __future__ import annotations

import re
from typing import Any

import yaml

from moesim.sim.study.fit_spec import load_measurements
from tests.util import ROOT

PATH = ROOT / "measurements" / "ktransformers-v021-deepseek-v3-context.yaml"
COLUMNS = {"hi (2)": 2, "1K (969)": 969, "2K (1930)": 1930, "4K (3846)": 3846, "8K (7678)": 7678}
"""The table's prompt columns as the tutorial heads them: label (prompt tokens)."""
SHORTEST = (2, 969)
"""The two shortest prompts: the header's fit rows (8 experts only)."""


def _rows() -> list[dict[str, Any]]:
    return list(yaml.safe_load(PATH.read_text())["rows"])


def _column(source: str) -> int:
    """The prompt length of the column a row's source names."""
    m = re.search(r"column 'Prompt ([^']+)'", source)
    assert m and m.group(1) in COLUMNS, source
    return COLUMNS[m.group(1)]


def test_the_file_loads_with_its_declared_roles() -> None:
    ms = load_measurements(PATH)
    assert len(ms.rows) == 20
    assert sum(spec.role == "fit" for spec in ms.rows) == 4


def test_every_value_is_the_number_its_source_quotes() -> None:
    for i, row in enumerate(_rows()):
        source, n = row["source"], _column(row["source"])
        assert source.startswith("https://github.com/kvcache-ai/ktransformers/blob/"), i
        if "ttft_ms" in row:
            m = re.search(r": ([\d.]+) tokens/s on the (\d+)-token prompt = (\d+) / ([\d.]+) s$", source)
            assert m, f"row {i}: {source}"
            rate, length = float(m.group(1)), int(m.group(2))
            assert length == n == int(m.group(3)) and float(m.group(4)) == rate, f"row {i}"
            assert row["set"]["trace.synthetic.prompt_len"] == n and row["set"]["workload.phases"] == ["prefill"], i
            assert row["ttft_ms"] == round(n / rate * 1000, 1), f"row {i}: {row['ttft_ms']} against {n} / {rate}"
        else:
            assert float(source.rsplit(": ", 1)[1]) == row["tokens_per_s"], f"row {i}"
            assert row["set"]["workload.context_tokens"] == n, i


def test_roles_follow_the_rule_in_the_header() -> None:
    for i, row in enumerate(_rows()):
        six = row["set"].get("model.top_k") == 6
        assert six == ("block '6 experts V0.2.1'" in row["source"]), f"row {i}: top_k and the block disagree"
        assert six == (row["set"].get("trace.synthetic.top_k") == 6), f"row {i}: the trace routes another top-k"
        expected = "fit" if not six and _column(row["source"]) in SHORTEST else "test"
        assert row["role"] == expected, f"row {i}: role {row['role']}, the header's rule gives {expected}"


def test_prefill_pays_its_eager_launches_and_decode_does_not() -> None:
    """V0.2.1 captures CUDA graphs for decode only (the header's (a)): the set's runtime charges
    97 launches x 9.02 us to each of the 58 MoE layers of a prefill, exactly, and nothing to a
    decode step."""
    from moesim.sim.study.fit_runs import row_jobs, run_job

    ms = load_measurements(PATH)
    jobs = row_jobs(ms)
    runtime = yaml.safe_load(PATH.read_text())["base"]["runtime"]
    assert (runtime["eager_prefill"], runtime["layer_kernels"], runtime["launch_us"]) == (True, 97, 9.02)
    off = (("runtime.eager_prefill", False),)
    decode, prefill = jobs[0], jobs[1]   # 8 experts at the 2-token prompt
    assert run_job(decode, ()).values == run_job(decode, off).values
    extra_ms = run_job(prefill, ()).values["ttft_ms"] - run_job(prefill, off).values["ttft_ms"]
    assert abs(extra_ms - 58 * 97 * 9.02 / 1000) < 1e-6
