#!/usr/bin/env bash
# Ranks launched by a real MPICH Hydra (mpiexec.hydra, the launcher Intel MPI's is built on),
# which gives PMI_RANK, PMI_SIZE and MPI_LOCALRANKID, and no job id: the rendezvous comes from
# -genv NCCL_COMM_ID, and without one every rank says how to pass it.
#   mpich_hydra.sh BUILD_DIR      exits 77 (ctest: skipped) without mpiexec.hydra
set -uo pipefail
# shellcheck disable=SC2034  # read by common.sh
BUILD="$1"
command -v mpiexec.hydra >/dev/null || { echo "skipped: no mpiexec.hydra (apt-get install mpich)"; exit 77; }
unset NCCL_COMM_ID MASTER_ADDR MASTER_PORT TUTTI_PORT RANK WORLD_SIZE
fail() { echo "FAILED: $*"; exit 1; }
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

source "$(dirname "$0")/common.sh"
run_perf 3 mpiexec.hydra -n 3 -genv NCCL_COMM_ID "127.0.0.1:$port"
run_train mpiexec.hydra -n 2 -genv NCCL_COMM_ID "127.0.0.1:$port"
if [ -n "${LAST_OUT:-}" ]; then
  grep -q "2 local ranks" <<<"$LAST_OUT" || fail "tutti-train did not read MPI_LOCALNRANKS"
fi

echo "== mpiexec.hydra -n 2 tutti-perf, no address"
out="$(timeout 60 mpiexec.hydra -n 2 "$BUILD/tutti-perf" all_reduce -b 8 -e 8 2>&1)"
rc=$?
echo "$out"
((rc != 0)) || fail "ranks without an address succeeded"
[ "$(grep -c "found PMI rank and size but no rendezvous address.*mpiexec -genv NCCL_COMM_ID" <<<"$out")" = 2 ] ||
  fail "not both ranks said how to pass the address"
echo "mpich hydra: PASSED"
