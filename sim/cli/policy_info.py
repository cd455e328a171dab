"""What ``simctl policies`` prints: the list of registered policies (readable in 80 columns)
and one policy's description (parameters with defaults, paper, trace columns it needs)."""

from __future__ import annotations

import inspect

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from moesim.policies.contract.base import Policy
from moesim.policies.contract.registry import make_policy, policy_class, policy_names, policy_params
from moesim.sim.core.escape import terminal, visible


def policy_kind(cls: type[Policy]) -> str:
    """``oracle bound``, ``lossy`` or ``lossless``."""
    return "oracle bound" if cls.oracle else ("lossy" if cls.lossy else "lossless")


def policy_table() -> Table:
    """One row per registered policy: name, kind and the one-line summary (no parameters, so
    that it fits 80 columns; ``simctl policies NAME`` has them)."""
    t = Table("policy", "kind", "what it does", expand=False)
    for name in policy_names():
        cls = policy_class(name)
        t.add_row(terminal(name), policy_kind(cls), terminal(cls.summary))   # a plugin's own text
    return t


def trace_needs(cls: type[Policy]) -> tuple[list[str], list[str]]:
    """(required, read when present) optional trace columns of the policy with its defaults;
    ``experts`` is always needed. A policy that does not declare what it reads gets every
    column, and is listed so."""
    pol = make_policy(cls.name, {})
    req = sorted(pol.required_columns())
    reads = sorted(set(pol.read_columns()) - set(req))
    return req, reads


def paper_of(cls: type[Policy]) -> str:
    """The policy's ``paper`` attribute, else the first sentence of its module's docstring
    (which names the paper or system the module reproduces)."""
    if cls.paper:
        return cls.paper
    mod = inspect.getmodule(cls)
    doc = (inspect.getdoc(mod) or "") if mod is not None else ""
    first = " ".join(doc.split("\n\n")[0].split())
    return first.replace("``", "") or "none stated"


def describe_policy(name: str) -> Group:
    """Everything a user needs to run policy ``name``."""
    cls = policy_class(name)
    doc = inspect.getdoc(cls) or ""
    first = " ".join(doc.split("\n\n")[0].split()).replace("``", "")
    req, reads = trace_needs(cls)
    head = Text.assemble((visible(name), "bold"), f" ({policy_kind(cls)}, {visible(cls.scope)} pool"
                         + (")" if not cls.decision_us else f", {cls.decision_us:g} us per decision)"))
    lines: list[RenderableType] = [head, Text(visible(cls.summary)), Text("")]   # Text: no markup
    if first:
        lines += [Text(visible(first)), Text("")]
    lines.append(Text(f"source: {visible(paper_of(cls))}"))
    lines.append(Text("trace must contain: experts" + "".join(f", {c}" for c in req)
                      + (f"; reads when present: {', '.join(reads)}" if reads else "")))
    needs = make_policy(name, {}).needs()
    lines.append(Text("runs as its paper meant it with: " + ("; ".join(needs.describe()) or "nothing more")
                      + (f" ({needs.source})" if needs.source else "")
                      + "; compare and sweeps apply these or mark the point n/a"))
    params = policy_params(cls)
    t = Table("parameter", "default", title=None, expand=False)
    for key, default in params.items():
        t.add_row(terminal(key), terminal(repr(default)))
    lines.append(Text(""))
    lines.append(t if params else Text("parameters: none"))
    lines.append(Text(f"set them in a scenario: policy: {{name: {name}, params: {{...}}}} "
                      f"or --set policy.params.KEY=VALUE"))
    return Group(*lines)
