#!/usr/bin/env bash
# Builds tutti on the emulated CUDA runtime with TUTTI_KERNEL_FILTER=float -- what a developer's
# filtered build has -- and runs kernel_filter_probe.cc on it: a reduction of a type without a
# kernel is refused at the call with a message naming the build's kernels, and nothing is lost.
# Arguments: the source tree, the CUDA toolkit's include directory, and a directory to build in
# (kept, so that a second run only builds what changed).
set -euo pipefail
src=$1 cuda_include=$2 work=$3
mkdir -p "$work"
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTUTTI_CUDA=EMU \
  -DTUTTI_KERNEL_FILTER=float -DTUTTI_BUILD_TESTS=OFF >"$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
grep -q "device kernels for  X(uint8, 1) X(float, 7)" "$work/configure.log" ||
  { echo "the filter did not leave float alone:"; grep "device kernels" "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j 2 --target nccl >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; exit 1; }
c++ -std=c++17 -O1 -I "$src/bindings/c/include" -I "$cuda_include" "$src/tests/abi/kernel_filter_probe.cc" \
  -o "$work/probe" -L "$work/build" -lnccl -Wl,-rpath,"$work/build"
"$work/probe"
