"""The paper's labs (``espn.reproduce``, ``espn.theory``) are clients of espn: nothing else in
the package imports them (the command line reaches their commands by module name, on use),
and they import only espn's public modules, so the core can change beneath them."""

from __future__ import annotations

import ast
from pathlib import Path

import espn

SRC = Path(espn.__file__).parent
LABS = ("espn.reproduce", "espn.theory")
#: what a lab may import: the front door and the modules ``docs/api.md`` names for it (its
#: section "Building on espn"): the packages' exports, recipes, helpers, the command line's
#: building blocks for the labs' own commands
PUBLIC = (
    "espn.utils.commands",
    "espn.runs.config",
    "espn.errors",
    "espn.evaluation.results",
    "espn.methods",
    "espn.settings.recipes",
    "espn.registry",
    "espn.settings.training",
    "espn.sweep",
    "espn.training.plan",
    "espn.utils.io",
    "espn.utils.plotting",
    "espn.utils.stats",
    "espn.utils.text",
)
#: internal imports a lab still makes, each with what it needs; a new one fails the test
KNOWN: dict[str, set[str]] = {}


def espn_imports() -> dict[str, dict[str, set[str]]]:
    """Per file of the package (``espn/x/y.py``), the espn modules it imports, anywhere in
    the file (inside functions too), each with the names imported from it."""
    found: dict[str, dict[str, set[str]]] = {}
    for path in sorted(SRC.rglob("*.py")):
        file = str(path.relative_to(SRC.parent))
        into = found.setdefault(file, {})
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules = {node.module: {a.name for a in node.names}}
            elif isinstance(node, ast.Import):
                modules = {a.name: set() for a in node.names}
            else:
                continue
            for module, names in modules.items():
                if module.split(".")[0] == "espn":
                    into.setdefault(module, set()).update(names)
    return found


def in_labs(name: str) -> bool:
    return any(name == lab or name.startswith(f"{lab}.") for lab in LABS)


def test_nothing_outside_the_labs_imports_them() -> None:
    found = espn_imports()
    assert "espn/reproduce/cli.py" in found and "espn/theory/cli.py" in found  # the walk saw them
    outside = {
        file: sorted(m for m in modules if in_labs(m))
        for file, modules in found.items()
        if not file.startswith(("espn/reproduce/", "espn/theory/"))
    }
    assert {f: m for f, m in outside.items() if m} == {}


def test_the_labs_import_only_espn_s_public_modules() -> None:
    found = espn_imports()
    internal: dict[str, set[str]] = {}
    for file, modules in found.items():
        if not file.startswith(("espn/reproduce/", "espn/theory/")):
            continue
        for module, names in modules.items():
            front_door = module == "espn" and names <= set(espn.__all__)
            if in_labs(module) or front_door or (module != "espn" and module in PUBLIC):
                continue
            internal.setdefault(module, set()).add(file)
    assert internal == KNOWN
    assert "espn.sweep" in found["espn/reproduce/runner.py"]  # the walk saw the core's modules


def test_the_command_line_reaches_the_labs_by_module_name() -> None:
    """``espn reproduce`` and ``espn theory`` are the labs' own command groups."""
    from espn.cli.main import COMMANDS, load_command

    assert COMMANDS["reproduce"][0] == "espn.reproduce.cli"
    assert COMMANDS["theory"][0] == "espn.theory.cli"
    assert {"list", "report"} <= set(load_command("reproduce").commands)
    assert "mismatch" in load_command("theory").commands
