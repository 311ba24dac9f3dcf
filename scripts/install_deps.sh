#!/usr/bin/env bash
# Installs every build and test dependency of Parallax from Debian 12 packages.
# Idempotent and non-interactive; returns in well under a second when all are present.
#   sudo bash scripts/install_deps.sh          # or as root
set -euo pipefail

# Build: compiler, CMake + Ninja, oneDNN (its CMake config needs the OpenCL headers and
# loader: libdnnl-dev only recommends them), fmt. Checkpoints: zstd. Text data and tokenizers: PCRE2, ICU, SentencePiece, JSON, zlib, and the
# GCIDE dictionary (pax's default corpus). Tests: GoogleTest, python3-venv (the interop tests'
# venv). Fuzzing: clang with libFuzzer (libclang-rt-dev) and its OpenMP. AUTO sharding's solver:
# CBC. Several processes and machines: Open MPI. Optional: benchmark, ccache.
PACKAGES=(
  g++ cmake ninja-build git
  libdnnl-dev ocl-icd-opencl-dev opencl-headers
  libfmt-dev
  libsentencepiece-dev nlohmann-json3-dev zlib1g-dev dict-gcide
  libgtest-dev googletest python3-venv
  clang libclang-rt-dev libomp-dev
  libpcre2-dev libicu-dev
  libzstd-dev
  libbenchmark-dev ccache
  libcli11-dev libtomlplusplus-dev libcairo2-dev
  coinor-libcbc-dev
  libopenmpi-dev openmpi-bin
)

missing=()
for p in "${PACKAGES[@]}"; do
  # "install ok installed" is the only state in which a package is usable.
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps: run as root (or install sudo)" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
echo "install_deps: done"
