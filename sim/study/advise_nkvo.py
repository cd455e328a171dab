"""llama.cpp's ``-nkvo`` (``--no-kv-offload``) as a ``simctl advise`` setting: what its options
rest on, in the caveat lines a buyer reads beside them (the options themselves are
:func:`moesim.sim.study.advise_options.llamacpp_host_kv_options`).

With ``-nkvo`` llama.cpp keeps the KV cache in host memory and runs attention on the CPU
(``llama_context_params.offload_kqv`` false; moesim's ``runtime.kv_on_host``, priced by
``CostModel.host_attention_s`` and ``kv_host_switch_s``): every decoded token reads the whole
context's KV cache at the host's memory rate rather than the GPU's, and each attention block
hands its query, key and value to the CPU and its output back. The VRAM the KV cache took holds
experts instead, which is what the option buys.

Its error band: the published llama.cpp rows whose runtime kept the KV cache in host memory
(column ``kv_on_host`` of ``advise_bands.csv``; the SOSP '25 artifact's llama-bench rows, run
with ``-nkvo 1``), when the GPU class has some; :func:`caveats` names the sets they come from.
"""

from __future__ import annotations

from typing import Any

from moesim.sim.study.advise_options import HOST_KV_FLAG

FLAG_WORDS = (f"llama-server and llama-cli take {HOST_KV_FLAG} (--no-kv-offload) alone, llama-bench takes "
              f"{HOST_KV_FLAG} 1")
"""How each llama.cpp tool spells the flag (``common/arg.cpp``'s switch; llama-bench's value list)."""


def host_kv_band_sets(cls: str, runtime: str) -> list[str]:
    """The measurement sets whose published llama.cpp rows with the KV cache in host memory
    make the band of a ``-nkvo`` option running ``runtime`` on a GPU of class ``cls`` (the rows
    :func:`moesim.sim.study.advise_bands.catalog_band` picks with ``host_kv``); none when its
    band rests on no such row."""
    from moesim.sim.study.advise_bands import band_rows, host_kv_rows

    rows, _, _ = band_rows("cpu-moe", cls, runtime=runtime, host_kv=True)
    return list(dict.fromkeys(r["set"] for r in host_kv_rows(rows)))


def caveats(cpu: Any, hw: Any, options: list[Any], cls: str, band_runtime: str | None, runtime: Any) -> list[str]:
    """One line for the ``-nkvo`` options among ``options`` (``Option.kv_on_host``), none when
    there are none: where the KV cache and attention then are, what a token's read of it costs on
    host ``cpu`` (at the rate ``runtime``, the runtime spec those options run, reads it: the
    catalog's or ``--runtime``'s) against GPU ``hw`` (at the largest KV cache advised), how each
    tool spells the flag, and, when the error bands are the published rows' (``band_runtime``: the
    runtime they were picked for, None when a fit's held-out error gives every band), which rows
    on a GPU of class ``cls`` the band rests on."""
    mine = [o for o in options if o.kv_on_host]
    if not mine:
        return []
    kv = max(o.memory.kv_gib for o in mine)
    host, gpu = cpu.runtime_read_gbps(runtime.numa_aware), hw.kv_gbps
    per_token, on_gpu = (kv * 2**30 / (rate * 1e9) * 1e3 for rate in (host, gpu))
    line = (f"llama.cpp with {HOST_KV_FLAG} ({len(mine)} option{'s' if len(mine) != 1 else ''}): the KV cache "
            f"({kv:.2f} GiB) is in host memory and attention runs on the CPU, so every decoded token reads it at the "
            f"host's {host:g} GB/s ({per_token:.2f} ms a token at the full context, against {on_gpu:.2f} ms at the "
            f"GPU's {gpu:g} GB/s) and each attention block hands off to the CPU and back: its speed falls as the "
            f"context grows and rests on the host's memory bandwidth; the VRAM it frees holds experts. {FLAG_WORDS}")
    if band_runtime is not None:
        sets = host_kv_band_sets(cls, band_runtime)
        line += (f"; its error band is the published llama.cpp rows run with -nkvo 1 of {', '.join(sets)} "
                 "(measurements/: the context each decoded from is there, and may be shorter than yours)" if sets else
                 "; no published llama.cpp row with the KV cache in host memory backs its error band (it is "
                 "llama.cpp's rows without it)")
    return [line]


__all__ = ["FLAG_WORDS", "caveats", "host_kv_band_sets"]
