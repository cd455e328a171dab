"""The expert computation on flat weights, shared by the executor and the calibration benchmarks
(so that what ``simctl calibrate`` times is exactly what the executor runs).

An expert's weights live in one flat tensor of ``3 * hidden * inter`` elements: the Mixtral
``gate_up_proj`` ``[2 * inter, hidden]`` followed by ``down_proj`` ``[hidden, inter]``; one copy
moves a whole expert.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def expert_numel(hidden: int, inter: int) -> int:
    """Elements of one expert's flat weights."""
    return 3 * hidden * inter


def split_weights(flat: torch.Tensor, hidden: int, inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views ``(gate_up [2I, H], down [H, I])`` into an expert's flat weights."""
    n_gu = 2 * inter * hidden
    return flat[:n_gu].view(2 * inter, hidden), flat[n_gu:].view(hidden, inter)


def pack_weights(gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One expert's flat weights from Mixtral's ``gate_up_proj[e]`` and ``down_proj[e]``."""
    return torch.cat([gate_up.reshape(-1), down.reshape(-1)])


def swiglu(x: torch.Tensor, flat: torch.Tensor, hidden: int, inter: int, act: Any = F.silu) -> torch.Tensor:
    """``down(act(gate(x)) * up(x))`` for ``x`` ``[n, H]`` with the expert's flat weights (the
    Mixtral expert of transformers 5.x, ``MixtralExperts.forward`` for one expert)."""
    gate_up, down = split_weights(flat, hidden, inter)
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(act(gate) * up, down)


def apply_expert(out: torch.Tensor, x: torch.Tensor, weights: torch.Tensor, tok: torch.Tensor,
                 slot: torch.Tensor, flat: torch.Tensor, hidden: int, inter: int) -> None:
    """Add one expert's weighted output for the tokens ``tok`` (their slots ``slot`` in the
    ``[n, k]`` combination ``weights``) into ``out``: the executor's whole per-expert work,
    which ``simctl calibrate`` times as the expert cost."""
    y = swiglu(x[tok], flat, hidden, inter)
    out.index_add_(0, tok, y * weights[tok, slot, None].to(y.dtype))
