#!/usr/bin/env bash
# Ranks launched by a real MPICH Hydra (mpiexec.hydra, the launcher Intel MPI's is built on),
# which gives PMI_RANK, PMI_SIZE and MPI_LOCALRANKID, and no job id: the rendezvous comes from
# -genv NCCL_COMM_ID, and without one every rank says how to pass it.
#   mpich_hydra.sh BUILD_DIR      exits 77 (ctest: skipped) without mpiexec.hydra
# shellcheck disable=SC2154  # free_pair sets port (printf -v)
set -uo pipefail
# shellcheck disable=SC2034  # read by common.sh
BUILD="$1"
command -v mpiexec.hydra >/dev/null || { echo "skipped: no mpiexec.hydra (apt-get install mpich)"; exit 77; }
unset NCCL_COMM_ID MASTER_ADDR MASTER_PORT TUTTI_PORT RANK WORLD_SIZE
fail() { echo "FAILED: $*"; exit 1; }
source "$(dirname "$0")/common.sh"
own_namespaces "$0" "$@"  # (ports of its own where it can; else as it is)
free_pair port

run_perf 3 mpiexec.hydra -n 3 -genv NCCL_COMM_ID "127.0.0.1:$port"
run_train mpiexec.hydra -n 2 -genv NCCL_COMM_ID "127.0.0.1:$port"
if [ -n "${LAST_OUT:-}" ]; then
  grep -q "2 local ranks" <<<"$LAST_OUT" || fail "tutti-train did not read MPI_LOCALNRANKS"
fi

echo "== mpiexec.hydra -n 2 tutti-perf, no address"
# Each rank's stderr goes to a file of its own: where every rank fails at once, Debian 12's
# Hydra may die writing to its proxy's closed control socket (SIGPIPE, or "write error (Broken
# pipe)" with SIGPIPE ignored) before it forwards their output; 2 runs in 60 under load here.
err="$(mktemp -d)"
out="$(timeout 60 mpiexec.hydra -n 2 sh -c 'exec "$0" all_reduce -b 8 -e 8 2>"$1.$PMI_RANK"' \
  "$BUILD/tutti-perf" "$err/rank" 2>&1)"
rc=$?
echo "$out"
cat "$err"/rank.* 2>/dev/null
echo "(exit status $rc)"
said="$(cat "$err"/rank.* 2>/dev/null | grep -c "found PMI rank and size but no rendezvous address.*mpiexec -genv NCCL_COMM_ID")"
rm -rf "$err"
((rc != 0)) || fail "ranks without an address succeeded"
[ "$said" = 2 ] || fail "not both ranks said how to pass the address"
echo "mpich hydra: PASSED"
