"""Derive the per-layer ``token_locality`` of the ``mixtral-8x7b`` synthetic preset.

Run: ``python benchmarks/fit_mixtral_preset.py`` (about 10 s). Prints the fitted profile (to
paste into ``traces/synthetic/generator.py``'s ``PRESETS``) and the target against what the preset then
gives at its default workload (8 requests of 128 prompt + 128 decode tokens, seed 0).

The target is token-to-token expert reuse per layer (``simctl trace stats``' ``reuse``)
rising linearly from 26% at layer 0 to 32% at layer 31. The range is the one moesim issue 15
reports for a real Mixtral-8x7B capture (it "varies 26-32% across layers"); the linear shape
is an assumption: no public source with Mixtral's per-layer reuse was found (the Mixtral
paper, arXiv 2401.04088 section 5, reports consecutive-token expert repetition for three
layers only). Only ``token_locality`` is fitted; the preset's other knobs stay as they are.
"""

from __future__ import annotations

import numpy as np

from moesim.traces.synthetic.fit import FitTarget, fit, measure
from moesim.traces.synthetic.generator import PRESETS, SynthParams

LOW, HIGH = 0.26, 0.32


def main() -> None:
    base = {k: v for k, v in PRESETS["mixtral-8x7b-legacy"].items() if k != "token_locality"}  # fit it afresh
    shape = SynthParams(**base).shape()
    L = shape.num_layers
    flat = measure(SynthParams(**base, token_locality=0.25))
    target = FitTarget(model=shape.name, num_layers=L, num_experts=shape.num_experts, top_k=shape.top_k,
                       reuse=tuple(np.linspace(LOW, HIGH, L)), entropy=flat.entropy, next_layer_acc=None,
                       requests=base["requests"], prompt_len=base["prompt_len"], decode_len=base["decode_len"])
    res = fit(target, base=base, knobs=["token_locality"], seed=0)
    prof = [round(float(x), 3) for x in res.params.locality_profile()]
    print("token_locality:", prof)
    got = measure(SynthParams(**base, token_locality=prof)).reuse
    print("layer  target  preset")
    for lay in range(L):
        print(f"{lay:5d}  {target.reuse[lay]:.3f}   {got[lay]:.3f}")
    print(f"max |error| {np.abs(got - np.asarray(target.reuse)).max():.4f}")


if __name__ == "__main__":
    main()
