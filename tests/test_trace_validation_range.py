"""A float in a trace too large for the column's type (float16 logits, float32 weights) is named
as such, in one line, not turned into inf with a numpy warning and called non-finite."""

from __future__ import annotations

import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moesim.sim.core.errors import MoesimError
from moesim.traces.format.trace_file import read_trace
from tests.util import ROOT


@pytest.mark.parametrize(("column", "value", "kind"), [("lookahead_logits", 1e300, "float16"),
                                                       ("lookahead_logits", 7e4, "float16"),
                                                       ("weights", 1e300, "float32")])
def test_value_beyond_the_column_type(tmp_path: Path, column: str, value: float, kind: str) -> None:
    src = ROOT / "traces" / "samples"
    sample = sorted(src.glob("*.parquet"))[0]
    table = pq.read_table(sample)
    if column not in table.column_names:
        pytest.skip(f"the sample has no {column}")
    rows = table.column(column).to_pylist()
    rows[3] = [value, *rows[3][1:]]
    typ = pa.list_(pa.float64())
    table = table.set_column(table.column_names.index(column), pa.field(column, typ), pa.array(rows, type=typ))
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.replace_schema_metadata(pq.read_schema(sample).metadata), bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no RuntimeWarning on the way
        with pytest.raises(MoesimError, match=rf"row 3, column '{column}': value beyond the range of {kind}"):
            read_trace(bad)
