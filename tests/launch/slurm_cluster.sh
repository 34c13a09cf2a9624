#!/usr/bin/env bash
# Ranks launched by a real srun, on a Slurm cluster this script starts (munged with its own key
# and socket, slurmctld, a slurmd per node) in a scratch folder; tutti-perf and tutti-train
# then run under srun and meet from Slurm's environment alone (tuttiCommInitFromEnv:
# SLURM_PROCID, SLURM_NTASKS, the step's first node, a port from the job id).
#   slurm_cluster.sh BUILD_DIR 1   one node, localhost; also a batch job requeued after a rank
#                                  failed, which tutti-train --auto-resume carries on
#   slurm_cluster.sh BUILD_DIR 2   two nodes, each in a network namespace of its own joined by
#                                  a veth pair, their names (t<pid>n1, t<pid>n2: Slurm lists
#                                  them as t<pid>n[1-2]) in a private /etc/hosts (the first
#                                  node's own name a loopback address on it, as Debian writes
#                                  it); 4 ranks, 2 a node, shm inside a node and tcp between
# Needs root. Runs in a PID and mount namespace of its own (unshare), so every process it starts
# ends with it, even when killed, and the /etc/hosts it mounts is seen by it alone. Exits 77
# (ctest: skipped) without root, Slurm, unshare or namespaces, or where a Slurm daemon cannot
# start here (its log says why).
set -uo pipefail
# shellcheck disable=SC2034  # read by common.sh
BUILD="$1"
NODES="${2:-1}"
skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "slurmd and munged need root here"
for t in munged mungekey slurmctld slurmd srun sinfo python3 unshare; do
  command -v "$t" >/dev/null || skip "no $t (apt-get install slurmd slurmctld slurm-client munge)"
done
source "$(dirname "$0")/common.sh"
own_namespaces "$0" "$@" || skip "cannot make PID and mount namespaces here"

scratch slurm  # (the daemons end with the PID namespace)
chmod 755 "$DIR"
logs() { for f in "$DIR"/log/*; do echo "---- $f"; tail -15 "$f"; done; }
fail() {
  echo "FAILED: $*"
  logs
  exit 1
}
mkdir -p "$DIR"/{state,log}

# Where each node's daemons and the ranks run: as is (one node), or in the node's network
# namespace alone (nsenter keeps this mount namespace; `ip netns exec` mounts a /sys of its own,
# without the cgroup file systems slurmd needs).
on() {
  local node="$1"; shift
  if ((NODES == 1)); then "$@"; else nsenter --net="/var/run/netns/$node" "$@"; fi
}
if ((NODES == 2)); then
  command -v nsenter >/dev/null || skip "no nsenter"
  two_hosts "$NSA" "$NSB" 10.231.78 "$TAG"
  case $? in
    1) skip "cannot create network namespaces here" ;;
    2) fail "the veth pair or its addresses" ;;
  esac
  N1="t${TAG}n1" N2="t${TAG}n2"
  { cat /etc/hosts; printf '10.231.78.1 %s\n10.231.78.2 %s\n' "$N1" "$N2"; } >"$DIR/hosts"
  # The first node sees its own name as Debian and Ubuntu write it, a loopback address
  # (127.0.1.1), in a file its slurmd (and so its steps' ranks) alone sees: tutti's root,
  # hosted there at that name, must still be reached from the second node.
  { cat /etc/hosts; printf '127.0.1.1 %s\n10.231.78.2 %s\n' "$N1" "$N2"; } >"$DIR/hosts.$N1"
  mount --bind "$DIR/hosts" /etc/hosts || skip "cannot mount a private /etc/hosts"
  CTLD_ADDR=10.231.78.1 CTLD_PORT=6817 SLURMD_PORT=6818
  NODE_LINES="NodeName=$N1 NodeAddr=10.231.78.1 CPUs=$(nproc) State=UNKNOWN
NodeName=$N2 NodeAddr=10.231.78.2 CPUs=$(nproc) State=UNKNOWN"
  HOSTS=("$NSA:$N1" "$NSB:$N2")
else
  free_pair CTLD_PORT
  SLURMD_PORT=$((CTLD_PORT + 1))
  CTLD_ADDR=127.0.0.1
  NODE_LINES="NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN"
  HOSTS=("-:localhost")
fi
FIRST="${HOSTS[0]%%:*}"

mungekey --create --keyfile="$DIR/munge.key" >/dev/null 2>&1 || fail "mungekey"
chmod 0400 "$DIR/munge.key"
munged --force --socket="$DIR/munge.socket" --key-file="$DIR/munge.key" \
  --pid-file="$DIR/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge.seed" ||
  skip "munged could not start here"

export SLURM_CONF="$DIR/slurm.conf"
# slurmctld runs only where SlurmctldHost names this host; it takes "localhost" for any.
cat >"$SLURM_CONF" <<EOF
ClusterName=tutti
SlurmctldHost=localhost($CTLD_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge.socket,cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
$NODE_LINES
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
on "$FIRST" slurmctld -D -i -f "$SLURM_CONF" >"$DIR/log/slurmctld.out" 2>&1 &
for h in "${HOSTS[@]}"; do
  own=()  # a node's own /etc/hosts, where it has one, in a mount namespace of its own
  [ -e "$DIR/hosts.${h#*:}" ] && own=(unshare --mount --propagation private
    sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$DIR/hosts.${h#*:}")
  on "${h%%:*}" "${own[@]}" slurmd -D -N "${h#*:}" -f "$SLURM_CONF" \
    >"$DIR/log/slurmd-${h#*:}.out" 2>&1 &
done
idle() { on "$FIRST" sinfo -h -N -o %t 2>/dev/null | grep -c idle; }
for _ in $(seq 60); do
  [ "$(idle)" = "$NODES" ] && break
  # A daemon that ended at start-up (no cgroup file system, say) is this machine's limit.
  for d in slurmctld slurmd; do
    if ! pgrep -f "$d -D .*$DIR" >/dev/null; then
      logs
      skip "$d could not start here (its log above)"
    fi
  done
  sleep 0.5
done
[ "$(idle)" = "$NODES" ] || fail "not $NODES idle nodes within 30 s: $(on "$FIRST" sinfo -N 2>&1)"
echo "== a Slurm cluster of $NODES node(s) is up:"
on "$FIRST" sinfo -N

# No other way to meet: the rendezvous must come from Slurm's variables.
unset NCCL_COMM_ID MASTER_ADDR MASTER_PORT TUTTI_PORT RANK WORLD_SIZE
((NODES == 2)) && export NCCL_SOCKET_IFNAME=v  # the veth ends (va..., vb...)
RANKS=$((2 * NODES))
echo "== where srun puts the ranks"
out="$(on "$FIRST" timeout 60 srun -N "$NODES" -n "$RANKS" -l bash -c \
  'echo "rank $SLURM_PROCID on $SLURMD_NODENAME of $SLURM_STEP_NODELIST," \
     "which is $(getent hosts "${SLURM_STEP_NODELIST%%[*}1" | cut -d" " -f1) there"' 2>&1)"
echo "$out"
if ((NODES == 2)); then  # each node sees the first node's name as it should
  grep -q "rank 0 on $N1 .* which is 127.0.1.1 there" <<<"$out" &&
    grep -q "rank 3 on $N2 .* which is 10.231.78.1 there" <<<"$out" ||
    fail "the nodes do not see the first node's name as set up"
fi
ON_FIRST=()  # the launch runs where on "$FIRST" would run it (timeout takes no function)
((NODES == 2)) && ON_FIRST=(nsenter --net="/var/run/netns/$FIRST")
run_perf "$RANKS" "${ON_FIRST[@]}" srun -N "$NODES" -n "$RANKS"
run_train "${ON_FIRST[@]}" srun -N "$NODES" -n 2

# A batch job that Slurm requeues after rank 1 failed at step 12 (the job asks for it, as a
# node failure would): its second run resumes from step 10 (tutti-train --auto-resume), and its
# last checkpoint holds the bytes of an uninterrupted run's. (cred_expire=10 above: a requeued
# job waits that long before it may start again; 120 s by default.)
if ((NODES == 1)) && [ -x "$BUILD/tutti-train" ]; then
  straight_run "$DIR/straight.ck" srun -n 2
  cat >"$DIR/job.sh" <<JOB
#!/bin/bash
export TUTTI_TRAINER_FAIL_AT=1:12
echo "run \${SLURM_RESTART_COUNT:-0} of job \$SLURM_JOB_ID"
if [ "\${SLURM_RESTART_COUNT:-0}" = 0 ]; then  # a batch script's own ranks, as threads
  echo "batch step: \${SLURM_STEP_ID:-no SLURM_STEP_ID}, SLURM_NTASKS \${SLURM_NTASKS:-unset}"
  $BUILD/tutti-perf all_reduce -t 2 -b 8 -e 64K -f 8 -n 2 -w 1 2>&1 |
    grep -E "rank\(s\) in all|Out of bounds|tutti-perf:"
fi
srun -n 2 $BUILD/tutti-train ${RESTART_ARGS[*]} --checkpoint $DIR/requeued.ck --auto-resume
rc=\$?
if [ \$rc -ne 0 ] && [ "\${SLURM_RESTART_COUNT:-0}" = 0 ]; then
  scontrol requeue \$SLURM_JOB_ID && sleep 60  # ended by the requeue
fi
exit \$rc
JOB
  job="$(sbatch --parsable --requeue --open-mode=append -n 2 -o "$DIR/job.out" "$DIR/job.sh")" ||
    fail "sbatch"
  echo "== sbatch --requeue: job $job (TUTTI_TRAINER_FAIL_AT=1:12, --auto-resume)"
  for _ in $(seq 240); do
    [ -z "$(squeue -h -j "$job" 2>/dev/null)" ] && break
    sleep 0.5
  done
  cat "$DIR/job.out"
  [ -z "$(squeue -h -j "$job" 2>/dev/null)" ] || fail "job $job did not end within 120 s"
  grep -q "host memory: 2 rank(s) in all" "$DIR/job.out" &&
    grep -q "Out of bounds values : 0 OK" "$DIR/job.out" ||
    fail "tutti-perf -t 2 in a batch script did not run its 2 ranks as threads"
  check_restarted "$(cat "$DIR/job.out")" "$DIR/requeued.ck" "$DIR/straight.ck" \
    "run 0 of job $job" "run 1 of job $job"
fi
echo "slurm cluster of $NODES node(s): PASSED"
