"""Physical bounds of fitted values, and the cost a value pressed against one asks for.

A measurement file declares bounds for each fitted key; physics may allow less, and the fit
then takes the tighter bound (:func:`physical_bound`), written in ``fitted.yaml`` with its
source:

* a copy rate (``hardware.pcie_gbps``, ``pageable_gbps``, ``d2h_gbps``) is at most the host
  link's theoretical rate (:mod:`moesim.sim.config.catalog.physics`; the hardware's
  ``pcie_gen``), the smallest over the rows the value applies to;
* a rate attention reaches is at most the hardware's: its KV-cache reads
  (``hardware.kv_read_gbps``) the memory's bandwidth (``hbm_gbps``), its products
  (``hardware.attention_tflops``) the peak (``peak_tflops``), the smallest over the rows the
  value applies to;
* a rate the host CPU reaches on experts is at most one socket's theoretical figure: its expert
  reads (``hardware.cpu.mem_gbps``) the memory channels' rate (``peak_gbps``), its expert
  products (``hardware.cpu.tflops``) the cores' peak for the kernel's instruction set
  (``peak_tflops``; both :mod:`moesim.sim.config.catalog.physics`), the smallest over the rows the
  value applies to; both are per socket, so one socket's fit carries to a host of two;
* a per-layer cost (``runtime.layer_us``, ``runtime.cpu_switch_us``, ``hardware.costs.layer_us``) is below
  the measured
  step over the model's layers, and a per-copy or per-miss cost (``hardware.pcie_latency_us``,
  ``runtime.demand_load_us``, ``runtime.prefetch_issue_us``) below the measured step, the
  smallest over the **fit**
  rows that measure a step (``tpot_ms``, ``ttft_ms``, ``tokens_per_s``; never a held-out row).

A fitted value at a bound is not a measurement: the data wants more than physics (or the
declared range) allows, so a cost the model charges elsewhere is missing or too large.
:func:`missing_cost` names the likely one for each key and side; the fit stops at the bound and
says so (``fitted.yaml``'s ``at_bound`` and ``missing_cost``, the terminal summary).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LINK_KEYS = ("hardware.pcie_gbps", "hardware.pageable_gbps", "hardware.d2h_gbps")
"""Copy rates: bounded by the link's theoretical rate."""
RATE_KEYS = {"hardware.kv_read_gbps": ("hbm_gbps", "GB/s"), "hardware.attention_tflops": ("peak_tflops", "TFLOP/s")}
"""Rates attention reaches, each bounded by the hardware's own figure (the field named)."""
HOST_KEYS = {"hardware.cpu.mem_gbps": ("peak_gbps", "GB/s per socket"),
             "hardware.cpu.tflops": ("peak_tflops", "TFLOP/s per socket")}
"""Rates the host CPU reaches on experts, each bounded by its socket's theoretical figure (the field named)."""
PER_LAYER_KEYS = ("runtime.layer_us", "runtime.cpu_switch_us", "hardware.costs.layer_us")
"""Costs paid once per layer of a step: bounded by the measured step over the layers."""
PER_COPY_KEYS = ("hardware.pcie_latency_us", "runtime.demand_load_us", "runtime.prefetch_issue_us")
"""Costs paid per copy or per miss: bounded by the measured step."""

_MISSING: dict[tuple[str, str], str] = {
    ("link", "max"): "copies faster than the link carries: the model moves bytes the system does not (smaller or "
                     "packed experts, more hits than the routing gives) or charges a per-layer time too large beside "
                     "them; look for a fixed cost per step that the link rate is absorbing",
    ("link", "min"): "a cost per copy or per miss beyond the bytes (hardware.pcie_latency_us; the host's lookup, "
                     "allocation and event per miss: runtime.demand_load_us) that the link rate is absorbing",
    ("rate", "max"): "attention faster than the hardware: the model charges more KV bytes or products than the "
                     "system does (a quantized KV cache: model.kv_dtype_bytes), or another cost that grows with the "
                     "context too small",
    ("rate", "min"): "a cost that grows with the context beyond the KV bytes and the products (a kernel that "
                     "re-reads the cache, a fixed cost per layer once there is a context) absorbed into the rate",
    ("host", "max"): "the CPU experts faster than the socket's channels or cores: the model reads or computes more "
                     "per expert than the system (weights smaller than the model's, experts skipped), or another "
                     "CPU-side cost (hardware.cpu.call_us, runtime.cpu_switch_us) charged too high beside them",
    ("host", "min"): "a CPU-side cost that does not scale with the expert bytes or products (per expert call: "
                     "hardware.cpu.call_us; per layer: runtime.cpu_switch_us, the threads' synchronisation) "
                     "absorbed into the rate",
    ("layer", "max"): "a cost per step that is not per layer (per miss: runtime.demand_load_us; per copy: "
                      "hardware.pcie_latency_us; per pass: runtime.iteration_us) absorbed into the layer",
    ("layer", "min"): "the step is shorter than the rest of the model allows: copies or expert compute charged "
                      "too high (a link slower than the system's, experts bigger than its own)",
    ("copy", "max"): "a per-step or per-layer cost (runtime.layer_us) absorbed into the per-copy cost",
    ("copy", "min"): "the step is shorter than the copies allow: fewer copies than the model makes (more hits, "
                     "overlap the model does not give)",
}


def _kind(key: str) -> str | None:
    if key in LINK_KEYS:
        return "link"
    if key in RATE_KEYS:
        return "rate"
    if key in HOST_KEYS:
        return "host"
    if key in PER_LAYER_KEYS:
        return "layer"
    if key in PER_COPY_KEYS:
        return "copy"
    return None


def missing_cost(key: str, side: str) -> str:
    """The cost a value of ``key`` at its ``side`` (min or max) bound seems to ask for."""
    kind = _kind(key)
    if kind is None:
        return ("the measurements ask for a value beyond the declared range: a cost or a setting the model does "
                "not have")
    return _MISSING[(kind, side)]


def step_us(metric: str, measured: float) -> float | None:
    """The measured step (one decode iteration, or a prefill for ``ttft_ms``) in microseconds,
    or None for a metric that is not a step's time."""
    if metric in ("tpot_ms", "ttft_ms"):
        return measured * 1000.0
    if metric == "tokens_per_s":
        return 1e6 / measured
    return None


def _hardware(data: dict[str, Any]) -> Any:
    from moesim.sim.config.catalog import get_hardware
    from moesim.sim.core.errors import MoesimError

    ref = data.get("hardware")
    if not isinstance(ref, (str, dict)):
        return None
    try:
        return get_hardware(ref)
    except (MoesimError, ValueError, TypeError):
        return None   # a profile file or an incomplete spec: no physical figure to read


def _layers(data: dict[str, Any]) -> int | None:
    from moesim.sim.config.catalog import get_model
    from moesim.sim.core.errors import MoesimError

    ref = data.get("model")
    if not isinstance(ref, (str, dict)):
        return None
    try:
        return int(get_model(ref).num_layers)
    except (MoesimError, ValueError, TypeError):
        return None


def _least(rows: list[Any], limit_of: Callable[[Any], tuple[float, str] | None]) -> tuple[float, str] | None:
    """The smallest ``(limit, source)`` that ``limit_of`` gives over ``rows`` (the first of equal
    ones), or None where it gives none."""
    best: tuple[float, str] | None = None
    for row in rows:
        found = limit_of(row)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    return best


def physical_bound(key: str, rows: list[Any]) -> tuple[float, str] | None:
    """The physical upper bound of ``key`` over ``rows`` (the rows the value applies to; only
    their fit rows for a step bound) and its source, or None where physics gives none here."""
    kind = _kind(key)
    if kind == "link":
        def link(row: Any) -> tuple[float, str] | None:
            hw = _hardware(row.data)
            limit = None if hw is None else hw.link_gbps
            if hw is None or limit is None:
                return None
            return limit, (f"physics: PCIe {hw.pcie_gen}.0 x{hw.pcie_lanes} of {hw.name} carries at most "
                           f"{limit:g} GB/s per direction (PCI-SIG base specification)")
        return _least(rows, link)
    if kind == "rate":
        field, unit = RATE_KEYS[key]

        def rate(row: Any) -> tuple[float, str] | None:
            hw = _hardware(row.data)
            if hw is None:
                return None
            limit = float(getattr(hw, field))
            return limit, f"physics: {hw.name} reaches at most {limit:g} {unit} ({field}: {hw.source_of(field)})"
        return _least(rows, rate)
    if kind == "host":
        field, unit = HOST_KEYS[key]

        def host(row: Any) -> tuple[float, str] | None:
            hw = _hardware(row.data)
            cpu = None if hw is None else hw.cpu
            value = None if cpu is None else getattr(cpu, field)
            if cpu is None or value is None:
                return None
            limit = float(value)
            return limit, (f"physics: a socket of host {cpu.name} reaches at most {limit:g} {unit} "
                           f"({field}: {cpu.sources.get(field, 'no source given')})")
        return _least(rows, host)
    if kind in ("layer", "copy"):
        best: tuple[float, str] | None = None
        for row in rows:
            if row.role != "fit" or row.reference is not None:
                continue
            for metric, value in row.measured.items():
                step = step_us(metric, value)
                if step is None:
                    continue
                if kind == "layer":
                    n = _layers(row.data)
                    if n is None:
                        continue
                    bound, why = step / n, f"the measured step of {row.where} ({step:.6g} us) over its {n} layers"
                else:
                    bound, why = step, f"the measured step of {row.where} ({step:.6g} us)"
                if best is None or bound < best[0]:
                    best = (bound, f"physics: a cost per {kind} is below {why}")
        return best
    return None
