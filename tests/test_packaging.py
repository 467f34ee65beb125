"""pyproject.toml declares what the package imports: a wheel installed by pip brings exactly these dependencies.
(`make wheel-check` builds and installs the wheel itself and runs the sample pipeline from it.)"""

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "nmt_cli"
OPTIONAL = ("serve", "export")  # subpackages that only the extras of the same names serve


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9._-]+)", requirement).group(1)).lower()


def _declared() -> tuple[set[str], set[str]]:
    tomllib = pytest.importorskip("tomllib")  # python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    extras = {_name(r) for name, reqs in project["optional-dependencies"].items() if not name.startswith("test")
              for r in reqs}
    return core, extras


def _imports() -> list[tuple[str, Path, bool]]:
    """(top-level module, file, imported at module level) for every absolute import of a third-party module."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        lazy = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("nmt_cli", "__future__"):
                    found.append((top, path, id(node) not in lazy))
    return found


def test_every_imported_package_is_declared():
    core, extras = _declared()
    dists = md.packages_distributions()
    missing, not_installed = [], set()
    for module, path, eager in _imports():
        if module not in dists:
            not_installed.add(module)
            continue
        names = {_name(d) for d in dists[module]}
        rel = path.relative_to(PACKAGE)
        # a module-level import outside serve/ and export/ runs with the core install: a core dependency
        allowed = core if eager and rel.parts[0] not in OPTIONAL else core | extras
        if not names & allowed:
            missing.append(f"{rel}: {module} ({', '.join(sorted(names))})")
    assert not missing, "imported but not declared in pyproject.toml " \
                        "(dependencies, or an extra for serve/, export/ and imports inside functions):\n" + \
                        "\n".join(sorted(set(missing)))
    if not_installed:
        pytest.skip(f"not installed here, so not checked: {', '.join(sorted(not_installed))}")


def test_package_data_is_declared():
    """The package's only files besides modules are nmt serve's web page (src/nmt_cli/serve/static), and
    pyproject's package-data (and MANIFEST.in, for the sdist) names each of them: the wheel carries them all."""
    import fnmatch

    tomllib = pytest.importorskip("tomllib")  # python >= 3.11
    others = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*")
              if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert others and all(p.startswith("serve/static/") for p in others), others
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert set(patterns) == {"nmt_cli.serve"}
    undeclared = [p for p in others if not any(fnmatch.fnmatch(p[len("serve/"):], g) for g in patterns["nmt_cli.serve"])]
    assert not undeclared, f"not in pyproject's package-data: {undeclared}"
    manifest = (ROOT / "MANIFEST.in").read_text()
    assert all(f"*.{p.rsplit('.', 1)[1]}" in manifest for p in others), "MANIFEST.in lacks an extension"
