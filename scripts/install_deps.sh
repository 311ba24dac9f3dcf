#!/usr/bin/env bash
# Installs every build and test dependency of Parallax from Debian 12 packages.
# Idempotent and non-interactive; returns in well under a second when all are present.
#   sudo bash scripts/install_deps.sh          # or as root
set -euo pipefail

# Build: compiler, CMake + Ninja, oneDNN (its CMake config needs the OpenCL headers and
# loader: libdnnl-dev only recommends them), fmt. Tests: GoogleTest. Optional: benchmark, ccache.
PACKAGES=(
  g++ cmake ninja-build git
  libdnnl-dev ocl-icd-opencl-dev opencl-headers
  libfmt-dev
  libgtest-dev googletest
  libbenchmark-dev ccache
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
