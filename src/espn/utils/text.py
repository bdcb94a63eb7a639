"""Text read from files, made safe to print: terminal control characters neutralised.

A run directory is data (it may have been downloaded), so a task name, method name or any
other string read from it may hold terminal escape sequences (``ESC]0;...`` retitles the
window, ``ESC[2J`` clears the screen) or bidirectional overrides that reorder what is shown.
Every such string goes through :func:`printable` before it reaches a terminal: each control
or invisible formatting character is shown as its Python escape (``\\x1b``), so the text is
still readable and nothing in it acts on the terminal.
"""

from __future__ import annotations

import re

#: C0 and C1 controls (tab and newline included: a printed cell or line stays one line),
#: DEL, zero-width and bidirectional formatting characters, line and paragraph separators
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(value: object, lines: bool = False) -> str:
    """``str(value)`` with every terminal control character shown as its escape (but for
    its line breaks, with ``lines``: text of several lines, such as a markdown table)."""
    if lines:
        return "\n".join(printable(line) for line in str(value).split("\n"))
    return _UNSAFE.sub(_escape, str(value))
