"""The documentation's promises: its examples run as written, its site's navigation names
pages that exist, and the command line prints messages as they were written.

The README's front-page example and every ```python block of ``docs/*.md`` run in a fresh
interpreter, in an empty directory, with nothing defined before them (a page's blocks in
order, in one namespace, as a reader would paste them); a page added later is covered by the
glob.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: the README's front-page example is the ```python block right after this marker
MARKER = "<!-- readme-example: python-api -->"
FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
#: pages whose examples take minutes (real data, full-size); they run with ``pytest -m slow``
SLOW_PAGES = {"avalanche.md"}


def checkout_env() -> dict[str, str]:
    """The environment of a fresh process that imports this checkout's ``espn``."""
    path = [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def python_blocks(text: str) -> list[tuple[int, str]]:
    """Every ```python block of a Markdown text: (line of its first code line, code)."""
    return [(text[: m.start(1)].count("\n") + 1, m.group(1)) for m in FENCE.finditer(text)]


def run_python(blocks: list[tuple[int, str]], source: Path, cwd: Path) -> str:
    """Run ``blocks`` in order in one namespace in a fresh interpreter (in ``cwd``, with this
    checkout's ``src`` first on the path) and return its stdout; a failure shows the
    traceback, whose line numbers are the Markdown file's."""
    script = cwd / "_blocks.py"
    script.write_text(
        "import sys\n"
        "namespace = {'__name__': '__main__'}\n"
        f"for line, code in {blocks!r}:\n"
        f"    exec(compile('\\n' * (line - 1) + code, {str(source)!r}, 'exec'), namespace)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=cwd, env=checkout_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, f"{source.name} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def readme_example() -> tuple[int, str]:
    """The README's front-page example, as written there."""
    text = README.read_text()
    after = text.index(MARKER)
    return next(
        (line, code) for line, code in python_blocks(text) if line > text[:after].count("\n")
    )


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    """Nothing is defined before it: it makes its own data, learns three tasks with ESPN-0.2,
    prints the accuracy matrix and the budgets, and exports task 0; every number the README
    says it prints is the number printed."""
    line, code = readme_example()
    assert len([c for c in code.splitlines() if c.strip()]) <= 15  # a short example
    out = run_python([(line, code)], README, tmp_path).splitlines()
    text = README.read_text()
    matrix = ast.literal_eval(out[0])
    assert f"`{out[0]}`" in text  # the matrix the README quotes
    assert matrix[1][0] == matrix[0][0] and matrix[2][:2] == matrix[1]  # nothing forgotten
    header, *rows = (r.split() for r in out[1 : 4 + 1])
    assert header[:2] == ["task", "name"] and [r[0] for r in rows] == ["0", "1", "2"]
    assert {r[4] for r in rows} == {"0.199"} and "0.199 of the dense FLOPs" in text
    owned = [r[-2] for r in rows]
    assert f"owns {owned[0]}, {owned[1]} and {owned[2]} of the network's weights" in text
    assert (tmp_path / "task0.pt2").is_file()


def doc_pages() -> list[object]:
    """Every docs page holding ```python blocks (slow pages marked slow)."""
    pages = sorted(p for p in DOCS.glob("*.md") if python_blocks(p.read_text()))
    return [
        pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.name in SLOW_PAGES else [])
        for p in pages
    ]


def test_the_docs_hold_examples() -> None:
    """The glob below finds the pages (an empty list would test nothing)."""
    names = {p.name for p in DOCS.glob("*.md") if python_blocks(p.read_text())}
    assert {"python.md", "methods.md", "models.md", "avalanche.md"} <= names


@pytest.mark.parametrize("page", doc_pages())
def test_every_docs_example_runs(page: Path, tmp_path: Path) -> None:
    """A page's ```python blocks, in order, in one namespace, as written."""
    blocks = python_blocks(page.read_text())
    if any(re.search(r"^\s*(from|import) avalanche\b", code, re.M) for _, code in blocks):
        pytest.importorskip("avalanche", reason="the avalanche extra is not installed")
    run_python(blocks, page, tmp_path)


def test_the_site_navigation_names_pages_that_exist() -> None:
    """Every page in mkdocs.yml's nav is a file in docs/ (and the API page is there)."""
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs"

    def pages(entries: object) -> list[str]:
        if isinstance(entries, str):
            return [entries]
        if isinstance(entries, list):
            return [p for e in entries for p in pages(e)]
        if isinstance(entries, dict):
            return [p for v in entries.values() for p in pages(v)]
        raise AssertionError(f"unexpected nav entry {entries!r}")

    named = pages(config["nav"])
    missing = [p for p in named if not (DOCS / p).is_file()]
    assert not missing, f"mkdocs.yml names pages that do not exist: {missing}"
    assert len(named) == len(set(named)) and "index.md" in named and "api.md" in named


# ------------------------------------------------------------ messages as written
def espn_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The ``espn`` command as a user runs it (a fresh process, this checkout's code)."""
    return subprocess.run(
        [sys.executable, "-m", "espn.cli.main", *args],
        cwd=cwd,
        env=checkout_env(),
        capture_output=True,
        text=True,
    )


def test_an_error_with_brackets_reaches_the_terminal_intact(tmp_path: Path) -> None:
    """Rich markup would read ``[ray]`` as a style tag and drop it; the messages are printed
    as written, one line, exit status 2."""
    done = espn_cli("run", "--benchmark", "nope[ray]", "--out", "x", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "unknown benchmark 'nope[ray]'" in lines[0]
    assert not (tmp_path / "x").exists()  # refused before anything was made

    from typer.testing import CliRunner

    from espn.cli.main import app

    shown = CliRunner().invoke(app, ["show", "runs/[bold]x[/]"])
    assert shown.exit_code == 2
    assert shown.stderr.strip() == (
        "error: no results.json in runs/[bold]x[/] (is it the --out of an `espn run`?)"
    )


def test_warnings_and_labels_are_printed_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    from espn.utils.commands import console, labelled, warn

    warn("install it: pip install 'espn[ray]' ([bold]not bold[/])")
    console.print(labelled("stopped early:", "yellow", "point [a]: failed [b]"))
    captured = capsys.readouterr()
    assert captured.err == "warning: install it: pip install 'espn[ray]' ([bold]not bold[/])\n"
    assert captured.out == "stopped early: point [a]: failed [b]\n"


def test_every_command_groups_help_is_printed_as_written() -> None:
    """No command group reads its help texts as rich markup (``[ray]`` in a help would
    vanish from ``--help``)."""
    import importlib

    from espn.cli.main import COMMANDS

    def groups(typer_app: object) -> list[object]:
        found = [typer_app]
        for info in typer_app.registered_groups:  # type: ignore[attr-defined]
            found += groups(info.typer_instance)
        return found

    # the command modules' apps (espn's own, the root, among them), loaded as commands run
    modules = [
        importlib.import_module(m) for m in dict.fromkeys(m for m, _, _ in COMMANDS.values())
    ]
    every = [g for m in modules if hasattr(m, "app") for g in groups(m.app)]
    assert len(every) >= 5
    assert all(g.rich_markup_mode is None for g in every)  # type: ignore[attr-defined]
