#!/usr/bin/env bash
# nmt installed the way users install it (`make wheel-check`, run by CI): `python -m build` makes the sdist and,
# from it, the wheel (into dist/); the wheel must hold the modules of src/nmt_cli, the web page of nmt serve
# (src/nmt_cli/serve/static, package-data) and its metadata, nothing else
# (no tests, bench, docs). It is then installed (not editable) into a fresh virtual environment, and `nmt --version`
# and the sample pipeline (prepare, a 30-update tiny train, translate, score) run from a directory outside the
# repository.
#
# PY: a python that has the package's dependencies (torch included) and `build`, as .venv/bin/python after
# `make install`. The new environment sees that python's site-packages through a .pth file (so no torch is
# downloaded), after its own: the wheel's nmt_cli comes first, which the check makes sure of; the editable install's
# path (src/) is not carried over. pip installs the wheel with --no-index: its declared dependencies must resolve
# from what is installed, without network. Building needs PyPI (build isolation fetches setuptools).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-.venv/bin/python}
DIST=${NMT_WHEEL_DIST:-dist}
STEPS=${NMT_WHEEL_STEPS:-30}
case "$PY" in /*) ;; */*) PY=$ROOT/$PY ;; esac
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/nmt-wheel-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
start=$SECONDS

echo "== python -m build (nmt-cli $version)"
rm -f "$DIST"/nmt_cli-"$version"-*.whl "$DIST"/nmt_cli-"$version".tar.gz
"$PY" -m build --outdir "$DIST" . > "$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
tail -n 1 "$WORK/build.log"
wheel=$DIST/nmt_cli-$version-py3-none-any.whl
sdist=$DIST/nmt_cli-$version.tar.gz
ls -l "$wheel" "$sdist"

echo "== what the wheel and the sdist hold"
"$PY" - "$wheel" "$sdist" "$version" <<'EOF'
import sys, tarfile, zipfile
from pathlib import Path

wheel, sdist, version = sys.argv[1:]
names = zipfile.ZipFile(wheel).namelist()
info = f"nmt_cli-{version}.dist-info/"
stray = [n for n in names if not n.startswith(("nmt_cli/", info))]
assert not stray, f"the wheel holds files outside the package: {stray}"
modules = {n for n in names if n.startswith("nmt_cli/")}
src = {p.relative_to("src").as_posix() for p in Path("src/nmt_cli").rglob("*.py") if "__pycache__" not in p.parts}
src |= {p.relative_to("src").as_posix() for p in Path("src/nmt_cli/serve/static").iterdir()}  # package-data
assert modules == src, f"the wheel's package differs from src/nmt_cli: missing {sorted(src - modules)}, " \
                       f"extra {sorted(modules - src)}"
assert f"{info}entry_points.txt" in names and f"{info}METADATA" in names, names
assert f"{info}licenses/LICENSE" in names, f"the wheel lacks the licence text: {names}"
print(f"wheel: {len(modules)} files of nmt_cli (= src/nmt_cli/**/*.py and serve/static/*) and "
      f"{len(names) - len(modules)} metadata files ({', '.join(n[len(info):] for n in names if n.startswith(info))})")
top = {n.split("/")[1] for n in tarfile.open(sdist).getnames() if n.count("/") >= 1 and n.split("/")[1]}
for needed in ("src", "tests", "docs", "pyproject.toml", "README.md", "LICENSE", "PKG-INFO"):
    assert needed in top, f"the sdist lacks {needed}: {sorted(top)}"
print(f"sdist: {', '.join(sorted(top))}")
EOF

echo "== a fresh virtual environment, the wheel installed into it"
"$PY" -m venv "$WORK/venv"
V=$WORK/venv/bin
purelib=$("$V/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# the site-packages directories of PY (its torch and the other dependencies), after the environment's own
"$PY" -c "import os, sys; print('\n'.join(p for p in sys.path if os.path.basename(p) in ('site-packages', 'dist-packages')))" \
    > "$purelib/_nmt_deps_from_parent.pth"
# ensurepip's own setuptools (python < 3.12; an old one) would hide PY's, which torch requires (>=77.0.3)
"$V/python" -m pip uninstall -q -y setuptools 2>/dev/null || true
"$V/python" -m pip install -q --no-index --no-cache-dir --disable-pip-version-check "$wheel"
"$V/python" - "$purelib" "$version" <<'EOF'
import importlib.metadata as md, os, sys

purelib, version = sys.argv[1:]
import nmt_cli

where = os.path.dirname(nmt_cli.__file__)
assert where == os.path.join(purelib, "nmt_cli"), f"nmt_cli comes from {where}, not from the wheel ({purelib})"
dist = md.distribution("nmt-cli")
assert dist.version == version and str(dist.locate_file("")) == purelib, (dist.version, dist.locate_file(""))
assert not (dist.read_text("direct_url.json") or "").count('"editable": true'), "an editable install"
print(f"nmt_cli {nmt_cli.__version__} from {where}")
EOF

echo "== the sample pipeline from the wheel, in $WORK/run (not the repository)"
mkdir "$WORK/run" && cd "$WORK/run"
PATH=$V:$PATH
test "$(command -v nmt)" = "$V/nmt"
out=$(nmt --version); echo "$ nmt --version"; echo "$out"
test "$out" = "nmt $version"
echo "$ nmt prepare sample -o data"
nmt prepare sample -o data
echo "$ nmt train data -o run --preset tiny --max-steps $STEPS"
nmt train data -o run --preset tiny --max-steps "$STEPS" > train.out 2>&1 || { cat train.out; exit 1; }
tail -n 3 train.out
test -f run/averaged.pt
echo "$ head -n 20 data/raw/test.en | nmt translate -m run/averaged.pt > hyp.de"
head -n 20 data/raw/test.en | nmt translate -m run/averaged.pt > hyp.de
test "$(wc -l < hyp.de)" -eq 20
head -n 20 data/raw/test.de > ref.de
echo "$ nmt score hyp.de -r ref.de"
nmt score hyp.de -r ref.de
echo "wheel check passed in $((SECONDS - start)) s (nmt-cli $version: $wheel, $sdist)"
