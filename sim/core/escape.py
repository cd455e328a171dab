"""Text from a file or from the user, escaped for where it is shown.

A trace's model name, a study's name, a policy's summary from a plugin, a warning, a path: any
of them may hold characters that mean something where they land. Each sink has one function:

* :func:`visible`: control characters (C0, DEL, C1, line and paragraph separators, the bidi
  embeddings, overrides, isolates and marks) written as Python escapes (``\\x1b``, ``\\n``,
  ``\\u202e``), so that a terminal or a log shows them instead of acting on them;
* :func:`terminal`: :func:`visible`, and rich's markup (``[red]``) escaped, for text printed
  through a rich console;
* :func:`md_text`: :func:`visible` (one line: it cannot start a block), then HTML's ``& < >``
  as entities (no raw HTML, no autolink), ``\\ ` * | ~`` backslash-escaped (no code span,
  emphasis, strike-through or end of a table cell) and the bracket pairs of links and images
  (``](``, ``][``, ``![``) and an ``_`` that could open or close emphasis broken by a
  backslash, so that the text is plain text in any CommonMark or GitHub renderer, raw HTML
  allowed or not. For readability an ``_`` between two letters or digits (never emphasis)
  and a lone ``[x]`` (a shortcut link needs a definition, which starts a line) stay as they
  are;
* :func:`md_code`: text as a Markdown code span or fenced block that no backtick run in it
  can close;
* :func:`csv_cell`: a text cell that a spreadsheet would take for a formula (starting with
  ``= + - @``, a tab or a carriage return) prefixed with ``'``, the usual guard; numbers
  (``-0.5`` as a number or as text) and a lone ``-`` (the tables' "none") are left alone. :func:`csv_safe` applies it to a frame.

HTML pages escape with :func:`html.escape` where they are built (``report_html``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069]")
_MD_PUNCT = re.compile(r"([\\`*|~])")
_MD_LINK = re.compile(r"\](?=[(\[])|(?<=!)\[")
_MD_UNDERSCORE = re.compile(r"(?<![^\W_])_|_(?![^\W_])")   # an "_" not between two letters or digits
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _code(ch: str) -> str:
    n = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\r":
        return "\\r"
    if ch == "\t":
        return "\\t"
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def visible(text: object) -> str:
    """``text`` with every control character written as its escape (``\\x1b``, ``\\n``)."""
    return _CONTROL.sub(lambda m: _code(m.group()), str(text))


def terminal(text: object) -> str:
    """``text`` for a rich console: control characters visible, markup escaped."""
    from rich.markup import escape

    return escape(visible(text))


def md_text(text: object) -> str:
    """``text`` as plain text in Markdown, also inside a table cell (one line, no raw HTML)."""
    s = visible(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD_LINK.sub(lambda m: "\\" + m.group(), _MD_PUNCT.sub(r"\\\1", s))
    return _MD_UNDERSCORE.sub(r"\\_", s)


def md_code(text: object, block: bool = False) -> str:
    """``text`` as a Markdown code span (or, with ``block``, a fenced block with ``sh``): its
    fence is longer than any backtick run in it; control characters visible."""
    s = visible(text)
    longest = max((len(m) for m in re.findall("`+", s)), default=0)
    if block:
        fence = "`" * max(3, longest + 1)
        return f"{fence}sh\n{s}\n{fence}"
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def csv_cell(value: Any) -> Any:
    """A CSV cell that no spreadsheet runs as a formula: text starting with ``= + - @``, a tab
    or a carriage return (and not a number) gets a leading ``'``; anything else is unchanged."""
    if isinstance(value, str) and len(value) > 1 and value.startswith(_FORMULA) and not _number(value):
        return "'" + value
    return value


def csv_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with :func:`csv_cell` applied to its text columns (a copy when any changes)."""
    import pandas as pd

    cols = [c for c in frame.columns if frame[c].dtype == object or pd.api.types.is_string_dtype(frame[c].dtype)]
    if not cols:
        return frame
    out = frame.copy()
    for c in cols:
        out[c] = [csv_cell(v) for v in frame[c]]
    return out
