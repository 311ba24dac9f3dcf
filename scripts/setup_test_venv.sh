#!/usr/bin/env bash
# Creates the Python virtual environment that the interop tests use (PyPI packages only) and
# prints its python. Idempotent: returns at once when every package is already installed.
#   bash scripts/setup_test_venv.sh            # venv in .venv-test/ at the repository root
#   PX_TEST_VENV=/path bash scripts/setup_test_venv.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PX_TEST_VENV:-$PWD/.venv-test}

# One package per line; each test that needs Python names what it imports here.
PACKAGES=(
  numpy
  safetensors
)

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
missing=()
for p in "${PACKAGES[@]}"; do
  name=${p%%[<>=]*}
  "$VENV/bin/python" -m pip show -q "$name" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup_test_venv: installing ${missing[*]}" >&2
  "$VENV/bin/python" -m pip install -q "${missing[@]}" >&2
fi
echo "$VENV/bin/python"
