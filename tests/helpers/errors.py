"""The one ``error:`` line a refused CLI command prints."""

from __future__ import annotations


def one_line_error(result, code: int = 2) -> str:
    """The one ``error:`` line of a failed command (no traceback), space-normalised."""
    assert result.exit_code == code, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return " ".join(lines[0].split())
