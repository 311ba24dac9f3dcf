#!/usr/bin/env bash
# Proves that the wheel `pip wheel .` makes is self-contained (docs/python.md, "Install"): the
# wheel is installed into a fresh venv that has never seen the source tree or the build dir, with
# only what the tests need from PyPI (the package's `test` extra: numpy, pytest, ml_dtypes; no
# torch, so the tests that need torch or transformers must skip, and say why), and the pytest
# suite, copied to a temp dir, runs there with the clone, the build dir and the shared test venv
# hidden (empty mounts in a private mount namespace, where `unshare` is allowed). Every shared
# library inside the installed package is checked: no RPATH/RUNPATH and no library that ldd
# resolves points into the clone or the build dir, and no text file of the package names them.
# Prints the wheel's size and the time of each step. From the repo root, after
# scripts/python_package.sh (the wheel reuses its persistent build dir: a repackage, not a rebuild):
#   PX_BUILD_DIR=build bash scripts/wheel_check.sh        # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1

say() { echo "wheel_check: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }
step_start=$(date +%s)
lap() {  # the time of the step just done
  local now
  now=$(date +%s)
  say "$1: $((now - step_start)) s"
  step_start=$now
}

PY=$(bash scripts/setup_test_venv.sh)  # the build requirements (scikit-build-core, nanobind)
build_dir=build-wheel                  # pyproject.toml's default
build_arg=()
if [ -n "${PX_BUILD_DIR:-}" ]; then
  build_dir=$PX_BUILD_DIR/python-wheel
  build_arg=("-Cbuild-dir=$build_dir")
fi
build_dir=$(readlink -m "$build_dir")
test_venv=$(readlink -f "$(dirname "$PY")/..")
work=$(mktemp -d "${TMPDIR:-/tmp}/px-wheel-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
case "$work/" in "$repo"/* | "$build_dir"/*) fail "the temp dir $work is inside the clone or the build dir" ;; esac

# 1. The wheel, from the same scikit-build-core build dir as scripts/python_package.sh.
"$PY" -m pip wheel -q --no-build-isolation --no-deps "${build_arg[@]}" -w "$work/dist" . >&2
wheel=$(echo "$work"/dist/parallax-*.whl)
[ -f "$wheel" ] || fail "pip wheel made no parallax wheel in $work/dist"
lap "pip wheel ($(basename "$wheel"), $(($(stat -c %s "$wheel") / 1024)) KiB)"

# 2. A fresh venv of the interpreter that built the wheel (its ABI tag), not a copy of the test
# venv: it sees no site-packages but its own. PyPI's packages come through pip's cache.
base=$("$PY" -c 'import sys; print(sys._base_executable)')
"$base" -m venv "$work/venv"
vpy=$work/venv/bin/python
"$vpy" -m pip install -q --disable-pip-version-check "$wheel[test]" >&2
lap "fresh venv with the wheel and its test extra (numpy, pytest, ml_dtypes)"

# 3. What the installed package links: nothing in the clone or the build dir.
pkg=$(cd "$work" && env -u PYTHONPATH "$vpy" -c 'import os, parallax; print(os.path.dirname(parallax.__file__))')
case "$pkg/" in "$work/venv/"*) ;; *) fail "import parallax found $pkg, not the fresh venv's package" ;; esac
mapfile -t libs < <(find "$pkg" -name '*.so*' -type f)
[ ${#libs[@]} -gt 0 ] || fail "no shared library in $pkg"
inside() { grep -E -e "$repo/" -e "$build_dir/" -e "$test_venv/"; }
for so in "${libs[@]}"; do
  # Each RPATH/RUNPATH entry must be relative to the library ($ORIGIN...), never an absolute path.
  absolute=$(readelf -d "$so" | sed -n 's/.*(R[UN]*PATH).*\[\(.*\)\]/\1/p' | tr ':' '\n' | grep -v '^\$ORIGIN' | grep . || true)
  [ -z "$absolute" ] || fail "$so has an RPATH/RUNPATH entry that is not relative to \$ORIGIN: $absolute"
  resolved=$(ldd "$so")
  if echo "$resolved" | grep -q 'not found'; then
    fail "$so needs libraries that are not installed:"$'\n'"$(echo "$resolved" | grep 'not found')"
  fi
  if echo "$resolved" | inside >/dev/null; then fail "$so loads a library from the clone or a build dir: $resolved"; fi
done
if grep -rIl -e "$repo/" -e "$build_dir/" "$pkg" "$work"/venv/lib/python*/site-packages/parallax-*.dist-info; then
  fail "the files above name the clone or the build dir"
fi
lap "ldd and RPATH/RUNPATH of ${#libs[@]} shared libraries, no path into the clone or build dir"

# 4. The test suite from a copy, with the clone, the build dir and the test venv out of reach:
# each is covered by an empty read-only tmpfs in a mount namespace of its own (a user namespace
# maps root), so a path into them that the package kept would fail here.
cp -r python/tests "$work/tests"
tests=("$vpy" -m pytest -q -rs -p no:cacheprovider . "$@")
hide='while [ $# -gt 0 ] && [ "$1" != -- ]; do
        if [ -d "$1" ]; then mount -t tmpfs -o ro,size=4k px-hidden "$1" || exit 1; fi; shift
      done; shift; exec "$@"'
if unshare --mount --map-root-user mount -t tmpfs -o ro,size=4k px-probe "$work/tests" 2>/dev/null; then
  tests=(unshare --mount --map-root-user sh -c "$hide" hide "$repo" "$build_dir" "$test_venv" -- "${tests[@]}")
  say "the clone, the build dir and the test venv are hidden while the tests run"
else
  say "unshare is not allowed here: the tests run with the clone in place (none of its paths on sys.path)"
fi
log=$work/pytest.log
set +e
(cd "$work/tests" && env -u PYTHONPATH -u LD_LIBRARY_PATH -u PYTHONHOME "${tests[@]}") 2>&1 | tee "$log" >&2
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -eq 0 ] || fail "pytest exited with $rc in the fresh venv"
grep -q "test_from_torch.py.*could not import 'torch'" "$log" ||
  fail "test_from_torch.py did not skip for want of torch (pytest -rs above)"
lap "pytest in the fresh venv"
