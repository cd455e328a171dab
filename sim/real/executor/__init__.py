"""A real executor: runs a Hugging Face MoE model (Mixtral architecture) with an expert cache in
device memory, copying experts from a host pool, driven by the same policy objects as the
simulator through the same hooks (:mod:`moesim.policies.contract.base`), and measures TTFT, TPOT, hit
rate and bytes on the wall clock.

One idea per module: :mod:`.kernels` (the expert SwiGLU on flat weights), :mod:`.copier`
(copy engines: synchronous, a copy thread on CPU, a CUDA copy stream with pinned memory and
events), :mod:`.store` (host pool and device slots), :mod:`.model` (building or loading the model
and putting the offloaded MoE block in place), :mod:`.residency` (room, evictions and copies),
:mod:`.runner` (the hook loop and the metrics). torch is imported only inside these modules,
which nothing imports at ``simctl`` start-up.
"""
