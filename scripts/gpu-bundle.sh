#!/usr/bin/env bash
# Builds what bench/gpu-check.sh runs into build-gpu/, with the shared libraries it needs that a
# bare GPU machine lacks (hwloc, CUnit, ...) copied into build-gpu/deps. The pinned arena's
# jemalloc, libwavelet-jemalloc.so (from deps/jemalloc, built by setup), is in build-gpu/lib.
#
# Why: the lent GPU machine has the CUDA toolkit, CMake and PyTorch but no Debian -dev packages
# and no network, so the project cannot be configured there. Its glibc is as new or newer than
# Debian 12's, so binaries built here run there. Usage (here):
#   scripts/gpu-bundle.sh            # then device run with carry ["build-gpu"]:
#   bash bench/gpu-check.sh          # on the GPU machine; results under $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-gpu}
scripts/setup.sh
# Hopper only (sm_90a): the lent machine is an H200, and one architecture halves compile time.
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DWAVELET_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a-real >/dev/null
cmake --build "$B" -j "$(nproc)"
# Where the tree was built: gpu-check.sh links this path to wherever the copy lands, since
# CTest files and RPATHs hold absolute paths.
pwd >"$B/source-dir"
# What was built, for the report (the copy on the GPU machine may have no .git).
echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null |
  grep -v '^??' >/dev/null && echo ' with uncommitted changes')" >"$B/source-commit"

# Copy every non-system, non-CUDA library the built programs load.
mkdir -p "$B/deps"
find "$B/bin" "$B/lib" "$B/tests" -type f -perm -u+x 2>/dev/null | while read -r f; do
  [ "$(head -c 4 "$f" | tail -c 3)" = ELF ] || continue
  ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
    libcud*|libcublas*|libnccl*|libcurand*|libnvrtc*|libcudnn*) ;;  # the GPU machine's own
    libwl*|libwavelet*) ;;                                            # ours, in $B/lib
    libopenblas*|libgfortran*|libquadmath*) ;;  # wl-bench-gemm's CPU baseline: not run there,
                                                # and 40 of the carry's 64 MiB
    *) cp -Lu "$lib" "$B/deps/" ;;
  esac
done
rm -rf "$B/CMakeFiles" "$B"/*/CMakeFiles "$B"/*/*/CMakeFiles
find "$B" -name '*.o' -delete
du -sh "$B"
echo "gpu-bundle: $B is ready; carry it to the GPU machine and run bash bench/gpu-check.sh"
