"""From a plan (``[n_tokens, k]`` expert ids, -1 = dropped) to work: the experts in access order
with the tokens and slots each serves, and the Mixtral combination weights."""

from __future__ import annotations

import numpy as np
import torch


def access_order(plan: np.ndarray, mask: np.ndarray, device: torch.device | None = None
                 ) -> tuple[list[int], dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """Distinct experts of ``plan[mask]`` by first occurrence (tokens in order, each token's slots
    in order: the simulator's access order), and for each the ``(token rows, slot columns)`` it
    serves, as index tensors on ``device`` (default the CPU; the expert kernel's ``index_add_``
    needs its index on the device of the activations)."""
    order: list[int] = []
    toks: dict[int, list[int]] = {}
    slots: dict[int, list[int]] = {}
    n, k = plan.shape
    for t in range(n):
        for j in range(k):
            if not mask[t, j]:
                continue
            e = int(plan[t, j])
            if e not in toks:
                order.append(e)
                toks[e], slots[e] = [], []
            toks[e].append(t)
            slots[e].append(j)
    rows = {e: (torch.tensor(toks[e], dtype=torch.long, device=device),
                torch.tensor(slots[e], dtype=torch.long, device=device)) for e in order}
    return order, rows


def combine_weights(logits: torch.Tensor, plan: np.ndarray) -> torch.Tensor:
    """Mixtral's combination weights for the planned experts: the router softmax over all
    experts (float32), taken at the planned ids and renormalised over each token's planned
    slots; a dropped slot (-1) weighs 0."""
    probs = torch.softmax(logits.float(), dim=-1)
    idx = torch.as_tensor(plan, dtype=torch.long, device=logits.device)
    valid = idx >= 0
    w = torch.gather(probs, 1, idx.clamp(min=0)) * valid
    return w / w.sum(dim=-1, keepdim=True).clamp(min=1e-20)
