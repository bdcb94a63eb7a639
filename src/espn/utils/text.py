"""Text read from files, made safe to print: terminal control characters shown as their
escapes (docs/reliability.md, "Printed text is escaped").
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
