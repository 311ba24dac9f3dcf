#!/usr/bin/env bash
# Builds and installs the Python package the documented way, `pip install .` at the repository
# root (one scikit-build-core build of the library and the bindings: pyproject.toml), into the test
# venv (scripts/setup_test_venv.sh), then runs `python -m pytest python/tests -q` from outside the
# source tree. From the repo root:
#   bash scripts/python_package.sh            # extra arguments go to pytest, e.g. -k jit
# The build dir persists: build-wheel/<wheel tag>/ (pyproject.toml), or $PX_BUILD_DIR/python-wheel
# when PX_BUILD_DIR is set, so that people building side by side keep separate trees. With ccache
# (the top-level CMakeLists.txt uses it) a first build over an existing build's objects is mostly
# cache hits, and a rebuild compiles only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1

PY=$(bash scripts/setup_test_venv.sh)
build_dir=()
[ -n "${PX_BUILD_DIR:-}" ] && build_dir=("-Cbuild-dir=$PX_BUILD_DIR/python-wheel")
# The venv already holds the build requirements (scikit-build-core, nanobind): no isolated build
# env, so nothing is downloaded here.
"$PY" -m pip install -q --no-build-isolation --no-deps "${build_dir[@]}" .
echo "python_package: installed in $(( $(date +%s) - start )) s" >&2

# From outside the source tree, so that `import parallax` is the installed package.
tests="$PWD/python/tests"
(cd "$(mktemp -d)" && "$PY" -m pytest "$tests" -q "$@")
echo "python_package: done in $(( $(date +%s) - start )) s" >&2
