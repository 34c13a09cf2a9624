#!/usr/bin/env bash
# Ranks launched by a real srun: a one-node Slurm cluster (munged, slurmctld, slurmd) started
# in a scratch folder with its own key, ports and state, then tutti-perf and tutti-train under
# `srun -n 2`, which find rank, size and rendezvous from Slurm's environment alone
# (tuttiCommInitFromEnv: SLURM_PROCID, SLURM_NTASKS, the step's first node, a port from the
# job id). The node is named localhost, so the rendezvous resolves without DNS.
#   slurm_one_node.sh BUILD_DIR     (needs root: munged and slurmd run as root here)
# Exits 77 (ctest: skipped) without root or Slurm; everything it started is stopped at exit.
set -uo pipefail
BUILD="$1"
if [ "$(id -u)" != 0 ]; then echo "skipped: slurmd and munged need root here"; exit 77; fi
for t in munged mungekey slurmctld slurmd srun sinfo; do
  command -v "$t" >/dev/null || { echo "skipped: no $t (apt-get install slurmd slurmctld slurm-client munge)"; exit 77; }
done

DIR="$(mktemp -d /tmp/tutti-slurm.XXXXXX)"
PIDS=()
cleanup() {
  # Every daemon's command line names $DIR (its key, socket or slurm.conf).
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  pkill -f "$DIR" 2>/dev/null
  for _ in $(seq 20); do pgrep -f "$DIR" >/dev/null || break; sleep 0.25; done
  pkill -9 -f "$DIR" 2>/dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*"
  for f in "$DIR"/log/*; do echo "---- $f"; tail -20 "$f"; done
  exit 1
}
mkdir -p "$DIR"/{state,spool,log}
read -r CTLD_PORT SLURMD_PORT < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')

mungekey --create --keyfile="$DIR/munge.key" >/dev/null 2>&1 || fail "mungekey"
chmod 0400 "$DIR/munge.key"
munged --force --socket="$DIR/munge.socket" --key-file="$DIR/munge.key" \
  --pid-file="$DIR/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge.seed" ||
  fail "munged did not start"
for _ in $(seq 20); do [ -s "$DIR/munged.pid" ] && break; sleep 0.1; done
PIDS+=("$(cat "$DIR/munged.pid" 2>/dev/null)")

export SLURM_CONF="$DIR/slurm.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=tutti
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -D -i -f "$SLURM_CONF" >"$DIR/log/slurmctld.out" 2>&1 &
PIDS+=("$!")
slurmd -D -N localhost -f "$SLURM_CONF" >"$DIR/log/slurmd.out" 2>&1 &
PIDS+=("$!")
for _ in $(seq 60); do
  sinfo -h -o %t 2>/dev/null | grep -q idle && break
  sleep 0.5
done
sinfo -h -o %t 2>/dev/null | grep -q idle || fail "the node did not come up idle within 30 s: $(sinfo 2>&1)"
echo "== one-node Slurm cluster up: $(sinfo -h -o '%P %t %N %c CPUs')"

# No other way to meet: the rendezvous must come from Slurm's variables.
unset NCCL_COMM_ID MASTER_ADDR MASTER_PORT TUTTI_PORT RANK WORLD_SIZE
echo "== srun -n 2 tutti-perf all_reduce"
out="$(timeout 120 srun -N 1 -n 2 "$BUILD/tutti-perf" all_reduce -b 8 -e 1M -f 32 -n 3 -w 1 2>&1)"
rc=$?
echo "$out"
((rc == 0)) || fail "srun tutti-perf exited with $rc"
grep -q "# Out of bounds values : 0 OK" <<<"$out" || fail "tutti-perf found wrong values"
grep -q "host memory: 2 rank(s) in all" <<<"$out" || fail "tutti-perf did not run 2 ranks"

if [ -x "$BUILD/tutti-train" ]; then
  echo "== srun -n 2 tutti-train"
  out="$(timeout 120 srun -N 1 -n 2 "$BUILD/tutti-train" --epochs 1 --train-limit 4000 \
    --test-limit 500 2>&1)"
  rc=$?
  echo "$out"
  ((rc == 0)) || fail "srun tutti-train exited with $rc"
  grep -q "tutti-train: 2 CPU ranks" <<<"$out" || fail "tutti-train did not run 2 ranks"
  [ "$(grep -c "epoch 1/1" <<<"$out")" = 1 ] || fail "not one epoch line (rank 0's alone)"
fi
echo "slurm one node: PASSED"
