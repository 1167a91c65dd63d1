#!/usr/bin/env bash
# Usage: run.sh BUILD_DIR PREFIX CONSUMER_SRC CC [FLAGS]: install, then build and run the consumer.
set -euo pipefail
build=$1 prefix=$2 src=$3 cc=$4 flags=${5:-}
rm -rf "$prefix" "$prefix-cmake"
cmake --install "$build" --prefix "$prefix" >/dev/null
test -f "$prefix/include/wavelet/alloc.h"
test -f "$prefix/lib/pkgconfig/wavelet.pc"
test -f "$prefix/lib/cmake/wavelet/waveletConfig.cmake"
# libwavelet.so loads the pinned arena's jemalloc from its own directory (when built so).
# (Two lines: the left side of && is exempt from set -e, so a missing first file passed.)
if [ -f "$build/lib/libwavelet.so" ] && [ -f "$build/lib/libwavelet-jemalloc.so" ]; then
  test -f "$prefix/lib/libwavelet.so"
  test -f "$prefix/lib/libwavelet-jemalloc.so"
fi

# 1. CMake package config.
cmake -S "$src" -B "$prefix-cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
      -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$prefix-cmake" >/dev/null
LD_LIBRARY_PATH="$prefix/lib" "$prefix-cmake/consumer"

# 2. pkg-config.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# The relocatable prefix leads back to the install prefix (LIBDIR's depth, not a fixed ../..).
test "$(realpath "$(pkg-config --variable=includedir wavelet)")" = "$(realpath "$prefix/include")"
# shellcheck disable=SC2046
"$cc" $flags -std=c11 -o "$prefix/consumer-pc" "$src/main.c" $(pkg-config --cflags --libs wavelet)
LD_LIBRARY_PATH="$prefix/lib" "$prefix/consumer-pc"
echo "install_consumer: both builds against the installed tree ran"
