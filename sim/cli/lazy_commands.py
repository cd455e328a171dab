"""Commands of ``simctl`` that live in other modules, loaded only when named.

Typer builds every registered command (its parameters, from the function's annotations) each
time the program starts, and registering one means importing its module: the ``trace``,
``model``, ``quality``, ``sweep``, ``compare``, ``plot`` and ``curve`` commands cost ``simctl
run`` about 50 ms of imports and parameter building that it never uses. Here they are named
with where they live; :func:`lazy_group` makes the top-level command group that imports and
builds one when it is asked for by name (a command line naming it, ``--help`` listing them all,
a mistyped name's suggestions), exactly as if it had been registered on the app.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import typer
import typer.main
from typer.core import TyperGroup


@dataclass(frozen=True)
class LazyCommand:
    """A command (a function) or a group of commands (a :class:`typer.Typer`) that
    ``module.attribute`` holds, registered under ``name`` with ``help`` (``None``: the
    function's docstring) as ``app.command`` / ``app.add_typer`` would register it."""

    name: str
    module: str
    attribute: str
    help: str | None = None
    group: bool = False

    def build(self, app: typer.Typer) -> Any:
        """Import the module and build the click command as ``app`` would have built it."""
        target = getattr(importlib.import_module(self.module), self.attribute)
        holder = typer.Typer()
        if self.group:
            holder.add_typer(target, name=self.name, help=self.help)
            return typer.main.get_group_from_info(
                holder.registered_groups[0], pretty_exceptions_short=app.pretty_exceptions_short,
                rich_markup_mode=app.rich_markup_mode, suggest_commands=app.suggest_commands)
        holder.command(self.name, help=self.help)(target)
        return typer.main.get_command_from_info(
            holder.registered_commands[0], pretty_exceptions_short=app.pretty_exceptions_short,
            rich_markup_mode=app.rich_markup_mode)


class _Commands(MutableMapping[str, Any]):
    """A group's commands by name: the built ones and the lazy ones, in listing order; reading
    a lazy one builds it (once)."""

    def __init__(self, order: list[str], built: Mapping[str, Any], build: Callable[[str], Any]) -> None:
        self._order = order
        self._built = dict(built)
        self._build = build

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            if name not in self._order:
                raise KeyError(name)
            self._built[name] = self._build(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        if name not in self._order:
            self._order.append(name)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        self._order.remove(name)
        self._built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._order


def lazy_group(app: Callable[[], typer.Typer], first: list[LazyCommand],
               last: list[LazyCommand]) -> type[TyperGroup]:
    """The command-group class for ``typer.Typer(cls=...)``: the commands ``first`` are listed
    before the app's own commands and ``last`` after them (``simctl --help`` keeps the order
    they were once registered in); ``app()`` is the app whose settings they are built with."""
    entries = {c.name: c for c in (*first, *last)}

    class LazyGroup(TyperGroup):
        """The top-level ``simctl`` group: commands of other modules load when named."""

        def __init__(self, **attrs: Any) -> None:
            super().__init__(**attrs)
            order = [c.name for c in first] + list(self.commands) + [c.name for c in last]
            self.commands = _Commands(order, self.commands, lambda name: entries[name].build(app()))

        def list_commands(self, ctx: Any) -> list[str]:
            """The command names in listing order (without building the lazy ones)."""
            return list(self.commands)

    return LazyGroup
