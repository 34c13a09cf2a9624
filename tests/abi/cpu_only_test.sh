#!/usr/bin/env bash
# Builds tutti with TUTTI_CUDA=OFF -- what a machine without the CUDA toolkit gets -- and runs
# host collectives on it with ranks as processes, so that a change that only compiles with
# CUDA fails here and not on the first CPU-only user's machine.
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# -Werror: code under #ifdef that only the CUDA build compiles tends to warn here first.
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTUTTI_CUDA=OFF \
  -DCMAKE_CXX_FLAGS=-Werror -DTUTTI_BUILD_TESTS=OFF >"$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
grep -q "tutti: CUDA OFF" "$work/configure.log" || { echo "configure did not turn CUDA off"; exit 1; }
cmake --build "$work/build" -j 2 --target nccl tutti-run tutti-perf >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; exit 1; }
out=$("$work/build/tutti-run" -n 2 "$work/build/tutti-perf" all_reduce -b 8 -e 64K -f 32 -n 2 \
  -w 1 -c 1 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep -q "Out of bounds values : 0 OK" || { echo "$out"; exit 1; }
# A GPU buffer request is refused with a message, not a crash.
if msg=$("$work/build/tutti-perf" all_reduce --mem device -b 8 -e 8 -t 1 2>&1); then
  echo "tutti-perf --mem device ran on a build without CUDA: $msg"
  exit 1
fi
echo "$msg" | grep -q "built without CUDA" || { echo "unexpected refusal: $msg"; exit 1; }
echo "cpu-only: the library builds without CUDA and runs a 2-process all_reduce"
