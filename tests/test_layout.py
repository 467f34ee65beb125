"""The package's layout as design.md describes it: where an arrow may not run, and one name one meaning."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "nmt_cli"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every nmt_cli module `path` imports, anywhere in it (functions and TYPE_CHECKING blocks included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("nmt_cli")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nmt_cli"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names
                      if (PACKAGE.parent / f"{node.module}.{a.name}".replace(".", "/")).with_suffix(".py").exists()
                      or (PACKAGE.parent / f"{node.module}.{a.name}".replace(".", "/")).is_dir()}
    return found


def _graph(under: str) -> dict[str, set[str]]:
    modules = {_module(p): p for p in (PACKAGE / under).rglob("*.py")}
    return {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}


def test_no_import_circle_in_training():
    graph = _graph("training")
    done, path = set(), []

    def visit(m: str) -> None:
        if m in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(m):] + [m]))
        if m in done:
            return
        path.append(m)
        for n in sorted(graph[m]):
            if not n.startswith(m + "."):  # (a package's __init__ naming its modules is no circle)
                visit(n)
        path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)


def test_checkpoints_import_nothing_above_them():
    """checkpoints/ (the format, its integrity check, averaging) is below the importers, the hub, training and
    inference: nothing there imports them."""
    above = ("nmt_cli.importers", "nmt_cli.hub", "nmt_cli.training", "nmt_cli.inference", "nmt_cli.commands")
    for path in (PACKAGE / "checkpoints").rglob("*.py"):
        bad = sorted(i for i in _imports(path) if i.startswith(above))
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


def test_no_module_is_named_like_a_package():
    """One name, one meaning: no module (outside commands/, named after the commands) has a package's name."""
    packages = {p.parent.name for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    clashes = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if p.stem in packages and p.name != "__init__.py" and p.parent.name != "commands")
    assert not clashes, f"modules named like a package: {clashes}"


def test_the_spawned_ranks_entry_is_named_once_without_torch():
    from nmt_cli.commands import train as command
    from nmt_cli.training import launch

    assert command.CHILD_MAIN == launch.CHILD_MAIN
