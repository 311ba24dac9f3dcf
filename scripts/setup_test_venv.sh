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
  # tests/nn/test_pretrained*.cc, tests/text/test_bpe.cc: small random HF models and tokenizers
  transformers
  tokenizers
  # With its CUDA libraries (~3 GB): PyPI's CPU wheel is the CUDA build, and without them
  # `import torch` fails (libtorch_cuda links them).
  torch
  "zarr>=3"      # tests/checkpoint: reads the Zarr v3 checkpoints (brings google-crc32c, numcodecs)
  tensorboard
  # scripts/python_package.sh: builds python/ (the parallax package) and runs python/tests
  nanobind
  scikit-build-core
  pytest
  ml_dtypes
  # python/tests/test_notebook.py: runs docs/notebooks/getting_started.ipynb (plots inline)
  nbclient
  nbformat
  ipykernel
  matplotlib
)

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# One pip call lists what is installed (pip show per package costs ~0.5 s each).
installed=$("$VENV/bin/python" -m pip list --format=freeze 2>/dev/null | sed 's/==.*//' | tr 'A-Z_' 'a-z-')
missing_in() {
  local p name
  for p in "$@"; do
    name=$(echo "${p%%[<>=]*}" | tr 'A-Z_' 'a-z-')
    grep -qx "$name" <<<"$installed" || echo "$p"
  done
}
mapfile -t missing < <(missing_in "${PACKAGES[@]}")
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup_test_venv: installing ${missing[*]}" >&2
  "$VENV/bin/python" -m pip install -q "${missing[@]}" >&2
fi
echo "$VENV/bin/python"
