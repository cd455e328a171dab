"""Policy plugins: Python files a scenario lists under ``plugins:``, imported only with the
user's word.

A plugin is code: importing it runs it with the user's rights. So no plugin file is read as
code unless the user allowed it for this command, with ``--allow-plugins`` or, for scripted
use, the environment variable ``MOESIM_ALLOW_PLUGINS=1`` (:func:`allow_plugins` sets the
variable, so that worker processes started afterwards inherit the consent; the study runners
also hand it to their workers explicitly). Without it, :func:`load_plugins` refuses with one
line naming every file and how to allow them, before any of them runs. A loaded file is named
with its SHA-256 (:func:`plugin_record`) in the run's summary and ``metrics.json``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

from moesim.policies.contract.registry import PolicyError, load_builtin_policies

ENV = "MOESIM_ALLOW_PLUGINS"
_LOADED: dict[str, str] = {}   # resolved path -> module name


class PluginsNotAllowed(PolicyError):
    """A scenario lists plugins and the user did not allow plugin code for this command."""


def plugins_allowed() -> bool:
    """Whether the user allowed plugin code for this command (``--allow-plugins``, or
    ``MOESIM_ALLOW_PLUGINS=1`` in the environment)."""
    return os.environ.get(ENV, "").strip() == "1"


def allow_plugins() -> None:
    """Allow plugin code in this process and in the processes it starts from now on (what
    ``--allow-plugins`` does)."""
    os.environ[ENV] = "1"


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, as hex."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def plugin_record(paths: list[Path]) -> list[dict[str, str]]:
    """``[{"file": absolute path, "sha256": hex}]`` for the plugin files of a run."""
    return [{"file": str(Path(p).resolve()), "sha256": file_sha256(Path(p))} for p in paths]


def check_allowed(paths: list[Path], source: str = "scenario") -> None:
    """Refuse (one line naming the files and how to allow them) unless plugins are allowed;
    nothing of the files is run."""
    if paths and not plugins_allowed():
        files = ", ".join(str(p) for p in paths)
        what = "a Python file that would run" if len(paths) == 1 else "Python files that would run"
        raise PluginsNotAllowed(f"{source}: plugins: {files}: {what} with your rights; to allow it, add "
                                f"--allow-plugins (or set {ENV}=1)")


def load_plugins(paths: list[Path], source: str = "scenario") -> None:
    """Import every plugin file (each resolved path once per process), after checking that
    plugins are allowed (:func:`check_allowed`); a missing file or an error while importing one
    is one line naming it."""
    check_allowed(paths, source)
    for p in paths:
        load_plugin(p)


def load_plugin(path: str | Path) -> None:
    """Import one Python file that registers policies (``@register``), once per resolved path,
    if plugins are allowed (:func:`check_allowed`). A missing file or an error while importing
    it is one line naming the file."""
    p = Path(path).expanduser().resolve()
    if str(p) in _LOADED:
        return
    check_allowed([Path(path)])
    if not p.is_file():
        raise PolicyError(f"{path}: no such policy plugin file")
    mod_name = f"moesim_plugin_{hashlib.sha256(str(p).encode()).hexdigest()[:10]}_{p.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, p)
    if spec is None or spec.loader is None:
        raise PolicyError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    load_builtin_policies()
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the plugin's own error, reported as one line naming it
        line = ""
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == str(p):
                line = f", line {tb.tb_lineno}"
            tb = tb.tb_next
        raise PolicyError(f"{path}{line}: {type(exc).__name__}: {exc}") from None
    sys.modules[mod_name] = module
    _LOADED[str(p)] = mod_name
