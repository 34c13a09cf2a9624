#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds a consumer with find_package(tutti)
# and a second one with pkg-config, and runs both.
set -euo pipefail
build=$1 consumer=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -L "$work/prefix/lib/libnccl.so" && test -e "$work/prefix/lib/libnccl.so.2"
test -f "$work/prefix/include/nccl.h" && test -f "$work/prefix/include/tutti.h"
cmake -S "$consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
LD_LIBRARY_PATH="$work/prefix/lib" "$work/build/consumer"
# (pkg-config's flags, a word each)
# shellcheck disable=SC2046
PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" c++ "$consumer/main.cc" -o "$work/pc" \
  $(PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" pkg-config --cflags --libs tutti)
LD_LIBRARY_PATH="$work/prefix/lib" "$work/pc"
echo "install: find_package(tutti) and pkg-config consumers built and ran"
