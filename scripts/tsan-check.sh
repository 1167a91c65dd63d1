#!/usr/bin/env bash
# The suites whose code runs on several threads at once (liballoc, libsched, the trace writer,
# the pinned arena, the interposer and the doubles under it) built and run under
# ThreadSanitizer. In CI after the ASan pass (about 4-5 minutes on 2 cores); the rest of the
# suite (kernels, benchmarks) is single-threaded or slow under TSan and is left out.
#   scripts/tsan-check.sh [BUILD]      # default build-tsan
# WAVELET_CUDA (AUTO, ON or OFF; default AUTO) is passed to CMake: CI sets ON.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-tsan}
# -Wtsan: TSan does not model atomic_thread_fence (liballoc's pointer map and thread caches use
# two); the warning is expected, not an error.
make build BUILD="$B" TYPE=Debug SANITIZE=thread \
  CMAKE_ARGS="-DCMAKE_C_FLAGS=-Wno-tsan -DWAVELET_CUDA=${WAVELET_CUDA:-AUTO}"
cd "$B"
# Every one of these must be there: a suite left out of the build (the CUDA doubles' and the
# interposer's without the toolkit) must fail the check, not shrink it.
tests='^(test_interpose(_2)?|test_alloc|test_pinned|test_sched_(group|ledger|gate|stress|phase)|test_trace_io|test_doubles_(driver|runtime))$'
expect=12
n=$(ctest -N -R "$tests" | sed -n 's/^Total Tests: //p')
if [ "$n" != "$expect" ]; then
  echo "tsan-check.sh: ${n:-no} tests match, expected $expect:" >&2
  ctest -N -R "$tests" >&2
  exit 1
fi
exec ctest --output-on-failure --no-tests=error -j "$(nproc)" -R "$tests"
