"""How to install an optional extra of moesim, said the same way by every command that needs one.

moesim is installed from its source checkout (README: ``pip install .``), not from a package
index: a hint naming ``moesim[extra]`` would send ``pip`` to PyPI, where no moesim of ours is.
"""

from __future__ import annotations

TORCH_PIN = "torch==2.13.0"
"""The torch the tracer extra is tested with (a pinned CPU build; an unpinned one pulls a CUDA
build of several GB)."""


def extra_hint(extra: str, *, torch: bool = False) -> str:
    """The command that installs ``extra`` into the environment moesim runs in, from the
    moesim checkout (with the pinned torch first when ``torch``)."""
    first = f"pip install '{TORCH_PIN}' && " if torch else ""
    return f"{first}pip install -e '.[{extra}]' in your moesim checkout (moesim is not on a package index)"


__all__ = ["TORCH_PIN", "extra_hint"]
