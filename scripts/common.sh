# shellcheck shell=bash
# Shared by scripts/demo and scripts/test: install what is missing, then configure and build.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
PACKAGES=(cmake g++ ninja-build ccache pkg-config libgtest-dev libgmock-dev libbenchmark-dev
          python3 binutils iproute2
          # the trainer demo (examples/trainer): Fashion-MNIST, OpenBLAS, zlib
          dataset-fashion-mnist libopenblas-dev zlib1g-dev
          # the comparison harness (bench/compare): Open MPI, Gloo, gnuplot
          openmpi-bin libopenmpi-dev libgloo-dev gnuplot-nox)
# What scripts/test needs beyond: launchers the tests start for real (tests/launch): Slurm
# clusters, MPICH's Hydra (Open MPI's mpirun stays the default mpirun), torchrun; and shellcheck
# (lint.shellcheck).
# shellcheck disable=SC2034  # read by scripts/test
TEST_PACKAGES=(slurmd slurmctld slurm-client munge mpich python3-torch shellcheck)

# install_deps [MORE_PACKAGES...]: PACKAGES and these, where missing.
install_deps() {
  local missing=()
  for p in "${PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "== installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

# build [CMAKE_BUILD_ARGS...]: configure BUILD_DIR (with CMAKE_ARGS) and build it (all, or e.g.
# --target NAME).
build() {
  echo "== building in $BUILD_DIR"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${CMAKE_ARGS:-} >/dev/null
  cmake --build "$BUILD_DIR" -j "$(nproc)" "$@"
}
