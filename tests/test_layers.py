"""Module layering: inference (translate, decoding, the model, export...) never imports training/; names are imported
from the module that defines them."""

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "nmt_cli"
INFERENCE = ["nmt_cli.inference", "nmt_cli.decoding", "nmt_cli.model", "nmt_cli.export", "nmt_cli.checkpoints",
             "nmt_cli.hub", "nmt_cli.runtime", "nmt_cli.serve", "nmt_cli.commands.translate"]


def _file(module: str) -> Path | None:
    path = SRC / Path(*module.split("."))
    if (path / "__init__.py").exists():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").exists() else None


def _imports(module: str, whole: bool = False) -> set[str]:
    """Every nmt_cli module `module` imports, at the top or inside a function (`whole`: a package with all its
    modules; otherwise a package is its __init__.py)."""
    path = _file(module)
    files = sorted(path.parent.rglob("*.py")) if whole and path is not None and path.name == "__init__.py" else [path]
    found = set()
    for f in files:
        if f is None:
            continue
        package = ".".join(f.relative_to(SRC).with_suffix("").parts[:-1])
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                found.add(base)
                found |= {f"{base}.{a.name}" for a in node.names if _file(f"{base}.{a.name}") is not None}
    return {m for m in found if m.startswith("nmt_cli") and _file(m) is not None}


def _closure(start: list[str]) -> dict[str, str]:
    """{module: the module that first imported it} over everything `start` reaches."""
    seen, todo = {m: "" for m in start}, list(start)
    while todo:
        current = todo.pop()
        for m in _imports(current, whole=current in start):
            if m not in seen:
                seen[m] = current
                todo.append(m)
    return seen


def test_the_walk_sees_training_where_it_is_imported():
    assert "nmt_cli.training.loop" in _closure(["nmt_cli.training.launch"])
    assert any(m.startswith("nmt_cli.training") for m in _closure(["nmt_cli.commands.train"]))


def test_inference_never_imports_training():
    reached = _closure(INFERENCE)
    bad = {m: by for m, by in reached.items() if m == "nmt_cli.training" or m.startswith("nmt_cli.training.")}
    assert not bad, f"inference modules import training/: {bad} (module: imported by)"


def test_translating_loads_no_training_module():
    code = ("import sys, nmt_cli.inference.translate, nmt_cli.export.ctranslate2, nmt_cli.export.huggingface; "
            "print([m for m in sys.modules if m.startswith('nmt_cli.training')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _defined(path: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments, also under if/try)."""
    names = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node in tree.body:
            names.add(node.name)
    for stmt in tree.body:
        for node in ast.walk(stmt) if isinstance(stmt, (ast.If, ast.Try)) else [stmt]:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


# The package facades that define their public names elsewhere on purpose: nmt_cli's lazy Translator (so that
# `import nmt_cli` stays free of torch) and decoding/'s one entry point to the engine.
FACADES = {"nmt_cli", "nmt_cli.decoding"}


def test_names_are_imported_from_the_module_that_defines_them():
    """No re-exports: `from nmt_cli.X import name` (in the package, tests, bench and scripts) names a submodule of X
    or something X defines, not a name X itself imported from elsewhere."""
    root = SRC.parent
    files = [*PKG.rglob("*.py"), *(root / "tests").glob("*.py"), *(root / "bench").rglob("*.py"),
             *(root / "scripts").glob("*.py")]
    bad = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if not (isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("nmt_cli")):
                continue
            if node.module in FACADES:
                continue
            path = _file(node.module)
            assert path is not None, f"{f.relative_to(root)} imports {node.module}, which does not exist"
            defined = _defined(path)
            bad += [f"{f.relative_to(root)}:{node.lineno}: {a.name} from {node.module}" for a in node.names
                    if a.name not in defined and _file(f"{node.module}.{a.name}") is None]
    assert not bad, "imported through a module that does not define it:\n" + "\n".join(bad)
