#!/usr/bin/env bash
# Installs the Debian packages the build needs, only those missing, and says which; then builds
# the pinned arena's private jemalloc into deps/jemalloc once (scripts/jemalloc.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# The packages every build needs; CUDA comes from the toolkit in /usr/local/cuda.
# dataset-fashion-mnist: wavelet-bench's data (/usr/share/datasets/fashion-mnist).
# libjemalloc-dev: the fallback when scripts/jemalloc.sh cannot build jemalloc.
pkgs=(cmake make gcc g++ pkg-config libjemalloc-dev libhwloc-dev libcunit1-dev zlib1g-dev
      libopenblas-dev libxml2-utils python3 dataset-fashion-mnist)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "wavelet: installing missing Debian packages: ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "wavelet: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Never fails: without it the build falls back to Debian's archive (one line says so).
scripts/jemalloc.sh
