"""``espn --version`` and ``python -m espn``, through the real commands (subprocesses)."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import espn

SRC = str(Path(espn.__file__).parents[1])  # the espn under test, not another installed one


def espn_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": SRC + (os.pathsep + path if path else "")}


def python_m_espn(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "espn", *args],
        capture_output=True,
        text=True,
        env=espn_env(),
        timeout=300,
    )


def test_python_m_espn_prints_the_version():
    done = python_m_espn("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"espn {espn.__version__}\n"


def test_the_version_is_the_distributions():
    """One declaration: pyproject reads the version from ``espn/_version.py``."""
    assert importlib.metadata.version("espn") == espn.__version__


def test_python_m_espn_is_the_cli():
    done = python_m_espn("--help")
    assert done.returncode == 0, done.stderr
    assert "Usage: python -m espn" in done.stdout
    assert "--version" in done.stdout and "reproduce" in done.stdout


@pytest.mark.skipif(shutil.which("espn") is None, reason="the espn console script is not installed")
def test_console_script_prints_the_version():
    done = subprocess.run(
        ["espn", "--version"], capture_output=True, text=True, env=espn_env(), timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"espn {espn.__version__}\n"
