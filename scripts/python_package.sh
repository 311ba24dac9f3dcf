#!/usr/bin/env bash
# Builds the Python package (python/) over the INSTALLED library and runs its tests:
#   1. installs the library (built in $PX_BUILD_DIR, default build/) into build/python-prefix,
#   2. pip-installs python/ into the test venv (scripts/setup_test_venv.sh), which compiles only
#      the bindings (find_package(parallax) through CMAKE_PREFIX_PATH),
#   3. runs `python -m pytest python/tests -q`.
# Run after the build (cmake -S . -B build -G Ninja && cmake --build build); from the repo root:
#   bash scripts/python_package.sh            # extra arguments go to pytest, e.g. -k jit
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PX_BUILD_DIR:-build}
PREFIX="$PWD/$BUILD/python-prefix"
start=$(date +%s)

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  echo "python_package: no build in $BUILD/; first: cmake -S . -B $BUILD -G Ninja && cmake --build $BUILD" >&2
  exit 1
fi
# A no-op after a full build; otherwise builds just what the install needs.
cmake --build "$BUILD" -j2 --target pax >/dev/null  # pax links every library component
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null

PY=$(bash scripts/setup_test_venv.sh)
# The venv already holds the build requirements (scikit-build-core, nanobind): no isolated build
# env, so nothing is fetched here. ccache, when present, makes rebuilds of the bindings instant.
launcher=""
command -v ccache >/dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
CMAKE_PREFIX_PATH="$PREFIX" CMAKE_ARGS="$launcher" \
  "$PY" -m pip install -q --no-build-isolation --no-deps ./python
echo "python_package: installed in $(( $(date +%s) - start )) s" >&2

# From outside the source tree, so that `import parallax` is the installed package.
(cd "$BUILD" && "$PY" -m pytest "$OLDPWD/python/tests" -q "$@")
echo "python_package: done in $(( $(date +%s) - start )) s" >&2
