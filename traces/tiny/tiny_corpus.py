"""The text the tiny MoE trains on: every machine's offline text, split by file into train and
held-out parts, as byte-level token ids.

By default the corpus is the running Python's standard library: its ``*.py`` sources (code,
comments and docstrings), without ``site-packages`` and without the test suites (``test/``,
``tests/``, ``idle_test/``: large generated data and fixtures). Any folder of text can be used
instead (``*.py``, ``*.txt``, ``*.md``, ``*.rst`` files, or the suffixes asked for).

Tokens are bytes: a file's UTF-8 bytes are its token ids ``0..255``; :data:`EOS_ID` (256)
ends each file. This is the tokenisation the tracer applies to a model without a tokenizer
(``simctl trace record`` reads text as UTF-8 bytes), so prompts need no tokenizer file.

Held-out files never overlap training files: a file is held out when the first byte of the
SHA-256 of its path relative to the corpus root, modulo :data:`HELD_OUT_MODULUS`, is 0 (about
1 in 10 files), whatever the machine or the file order. Pure Python and numpy: no torch.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moesim.sim.core.errors import MoesimError

VOCAB_SIZE = 257
"""Token ids: 0..255 the bytes, 256 the end-of-file token."""
EOS_ID = 256
"""The token that ends every file (also the model's ``eos_token_id``)."""
HELD_OUT_MODULUS = 10
"""One file in ``HELD_OUT_MODULUS`` (by path hash) is held out."""
DEFAULT_SUFFIXES = (".py", ".txt", ".md", ".rst")
"""File suffixes read from a user folder (the stdlib default reads ``.py`` only)."""
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


def stdlib_root() -> Path:
    """The folder of the running Python's standard library (its ``*.py`` files)."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relpath: str) -> bool:
    """Whether the file at ``relpath`` (POSIX path relative to the corpus root) is held out."""
    return hashlib.sha256(relpath.encode("utf-8")).digest()[0] % HELD_OUT_MODULUS == 0


@dataclass(frozen=True)
class Corpus:
    """A corpus as two token streams (``uint16`` ids, files joined, each ended by EOS).

    ``root`` is where the files came from; ``train_files`` / ``held_out_files`` count them;
    ``digest`` is the SHA-256 of every (relative path, content) in order, so two corpora with
    the same digest are the same text.
    """

    root: Path
    train: np.ndarray
    held_out: np.ndarray
    train_files: int
    held_out_files: int
    digest: str

    def describe(self) -> str:
        """One line: where, how many files and bytes, the digest's first 12 hex digits."""
        return (f"{self.root}: {self.train_files} train files ({self.train.size:,} tokens), "
                f"{self.held_out_files} held-out files ({self.held_out.size:,} tokens), "
                f"sha256 {self.digest[:12]}")


def _files(root: Path, suffixes: tuple[str, ...], skip_tests: bool) -> list[Path]:
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if skip_tests and any(part in _SKIP_DIRS for part in rel.parts[:-1]):
            continue
        if p.suffix in suffixes and p.is_file():
            out.append(p)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def load_corpus(folder: str | Path | None = None, *, suffixes: tuple[str, ...] | None = None,
                max_bytes_per_file: int = 200_000) -> Corpus:
    """Read a corpus: ``folder`` (default: the standard library, ``*.py`` only, tests skipped).

    Files larger than ``max_bytes_per_file`` are truncated to it (a few generated tables would
    otherwise dominate). Files that are not UTF-8 are skipped. A folder without any train or
    held-out file is a one-line :class:`MoesimError`.
    """
    sfx: tuple[str, ...]
    if folder is None:
        root, sfx, skip = stdlib_root(), (".py",), True
    else:
        root, sfx, skip = Path(folder), tuple(suffixes or DEFAULT_SUFFIXES), False
        if not root.is_dir():
            raise MoesimError(f"--corpus {folder}: no such folder")
    train: list[np.ndarray] = []
    held: list[np.ndarray] = []
    h = hashlib.sha256()
    eos = np.array([EOS_ID], dtype=np.uint16)
    for p in _files(root, sfx, skip):
        data = p.read_bytes()[:max_bytes_per_file]
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not data.strip():
            continue
        rel = p.relative_to(root).as_posix()
        h.update(rel.encode("utf-8") + b"\0" + data + b"\0")
        ids = np.concatenate([np.frombuffer(data, dtype=np.uint8).astype(np.uint16), eos])
        (held if is_held_out(rel) else train).append(ids)
    if not train or not held:
        raise MoesimError(f"corpus {root}: needs files on both sides of the held-out split "
                          f"(found {len(train)} train and {len(held)} held-out files with "
                          f"suffixes {', '.join(sfx)})")
    return Corpus(root=root, train=np.concatenate(train), held_out=np.concatenate(held),
                  train_files=len(train), held_out_files=len(held), digest=h.hexdigest())


def encode(text: str) -> list[int]:
    """Token ids of ``text``: its UTF-8 bytes (no EOS)."""
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    """Text of byte token ids (EOS and invalid UTF-8 shown as U+FFFD)."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def held_out_prompts(corpus: Corpus, n: int, length: int, *, seed: int = 0) -> list[str]:
    """``n`` prompts of at most ``length`` bytes cut from the held-out text (never trained on).

    Each starts at a line start after a start drawn by ``numpy.random.default_rng(seed)``,
    stays inside one file (stops before its end-of-file token) and ends on a UTF-8 boundary.
    """
    if n < 1 or length < 1:
        raise MoesimError(f"prompts: need n >= 1 and length >= 1, got n={n}, length={length}")
    stream = corpus.held_out
    if stream.size < 2 * length:
        raise MoesimError(f"held-out text has {stream.size} tokens, too few for prompts of {length}")
    rng = np.random.default_rng(seed)
    out: list[str] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n:
            raise MoesimError(f"could not cut {n} prompts of {length} bytes from the held-out text")
        start = int(rng.integers(0, stream.size - length))
        newline = np.flatnonzero(stream[start:start + length] == 10)
        if newline.size == 0:
            continue
        start += int(newline[0]) + 1
        chunk = stream[start:start + length]
        end = np.flatnonzero(chunk == EOS_ID)
        if end.size:
            chunk = chunk[: int(end[0])]
        text = bytes(chunk.astype(np.uint8)).decode("utf-8", errors="ignore")
        if len(text.strip()) >= length // 2:
            out.append(text)
    return out
