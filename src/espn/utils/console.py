"""The console espn prints tables and lines to: unwrapped when output is not a terminal."""

from __future__ import annotations

from rich.console import Console, ConsoleDimensions

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
