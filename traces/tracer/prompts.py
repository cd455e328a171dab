"""Prompts files for the tracer: one request per line, as text or token ids.

Plain text (one prompt per line) or JSON lines (``text`` or ``input_ids``, optionally a
``completion`` or ``completion_ids`` for teacher forcing); see :func:`read_prompts`. Needs
neither torch nor transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moesim.sim.core.errors import MoesimError


@dataclass(frozen=True)
class Prompt:
    """One request: prompt token ids and, for teacher forcing, an optional completion."""

    input_ids: tuple[int, ...]
    completion_ids: tuple[int, ...] | None = None


PROMPT_KEYS = ("text", "input_ids", "completion", "completion_ids")


def byte_tokenize(text: str, vocab_size: int) -> list[int]:
    """The fallback tokenisation when a model has no tokenizer: the UTF-8 bytes of ``text``
    (ids 0..255), reduced modulo ``vocab_size`` when the vocabulary is smaller. Deterministic,
    no special tokens."""
    return [b % vocab_size for b in text.encode("utf-8")]


def read_prompts(path: str | Path, *, tokenizer: Any | None, vocab_size: int) -> tuple[list[Prompt], str]:
    """Read a prompts file into :class:`Prompt` records; returns them and how text was
    tokenised (``"tokenizer"``, ``"bytes"`` or ``"input_ids"``).

    ``*.jsonl`` files hold one JSON object per line with exactly one of ``text`` (string) or
    ``input_ids`` (list of ints) and optionally one of ``completion`` / ``completion_ids``
    (teacher-forced continuation); other keys are errors. Any other file is plain text, one
    prompt per line (blank lines skipped). Text goes through the model's tokenizer, or the
    byte fallback (:func:`byte_tokenize`) when the model has none.
    """
    p = Path(path)
    if not p.is_file():
        raise MoesimError(f"{p}: no such prompts file")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise MoesimError(f"{p}: not UTF-8 text ({exc.reason})") from None
    used: set[str] = set()

    def tok(text: str, special: bool) -> list[int]:
        if tokenizer is not None:
            used.add("tokenizer")
            return list(tokenizer(text, add_special_tokens=special)["input_ids"])
        used.add("bytes")
        return byte_tokenize(text, vocab_size)

    def ids_of(val: Any, where: str, key: str) -> list[int]:
        if not isinstance(val, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in val):
            raise MoesimError(f"{where}: {key!r} must be a list of integers")
        bad = [v for v in val if not 0 <= v < vocab_size]
        if bad:
            raise MoesimError(f"{where}: {key!r} holds token id {bad[0]} outside 0..{vocab_size - 1}")
        used.add("input_ids")
        return list(val)

    prompts: list[Prompt] = []
    jsonl = p.suffix.lower() == ".jsonl"
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{p}, line {lineno}"
        if not jsonl:
            ids = tok(line, True)
            if not ids:
                raise MoesimError(f"{where}: the prompt has no tokens")
            prompts.append(Prompt(tuple(ids)))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MoesimError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise MoesimError(f"{where}: expected a JSON object")
        unknown = sorted(set(obj) - set(PROMPT_KEYS))
        if unknown:
            raise MoesimError(f"{where}: unknown key {unknown[0]!r} (expected {', '.join(PROMPT_KEYS)})")
        if ("text" in obj) == ("input_ids" in obj):
            raise MoesimError(f"{where}: give exactly one of 'text' or 'input_ids'")
        if "completion" in obj and "completion_ids" in obj:
            raise MoesimError(f"{where}: give at most one of 'completion' or 'completion_ids'")
        if "text" in obj:
            if not isinstance(obj["text"], str):
                raise MoesimError(f"{where}: 'text' must be a string")
            ids = tok(obj["text"], True)
        else:
            ids = ids_of(obj["input_ids"], where, "input_ids")
        completion: list[int] | None = None
        if "completion" in obj:
            if not isinstance(obj["completion"], str):
                raise MoesimError(f"{where}: 'completion' must be a string")
            completion = tok(obj["completion"], False)
        elif "completion_ids" in obj:
            completion = ids_of(obj["completion_ids"], where, "completion_ids")
        if not ids:
            raise MoesimError(f"{where}: the prompt has no tokens")
        prompts.append(Prompt(tuple(ids), None if completion is None else tuple(completion)))
    if not prompts:
        raise MoesimError(f"{p}: no prompts")
    return prompts, "+".join(sorted(used))
