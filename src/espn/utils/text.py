"""Text read from files, made safe to print: terminal control characters shown as their
escapes (docs/reliability.md, "Printed text is escaped"); the console espn prints to.
"""

from __future__ import annotations

import re

from rich.console import Console, ConsoleDimensions

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


#: the width of output that is not a terminal (a pipe, a log file): lines are not wrapped
UNWRAPPED = 10_000


class OutputConsole(Console):
    """A console that wraps at the terminal's width on a terminal, and not at all elsewhere:
    a table or line piped to a file or another program stays one line per row (rich's 80
    columns would cut task names and break wide tables across lines). Decided at each print,
    so output redirected after start-up is seen as such; a width set explicitly wins."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is None and not self.is_terminal:
            return ConsoleDimensions(UNWRAPPED, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size
