# shellcheck shell=bash
# Sourced by the launcher tests: runs tutti-perf and tutti-train under a launcher and checks
# what every launch must give. The caller defines fail() (print, clean up, exit 1).

# own_namespaces SCRIPT ARGS...: runs SCRIPT ARGS again in PID, mount and (where it can) network
# namespaces of its own and does not return. So every process the script starts ends with it,
# even when killed (--kill-child ends the namespace's first process with the script, and with it
# every process inside); it may bind-mount files for itself alone; and its ports are its own
# (lo comes up there), so another test's cannot take one it picked (ctest -j2). The network
# namespace looks like a host's: lo and one network interface with an address (eth0, one end of
# a veth pair, 10.231.77.1): with lo alone, a family's getaddrinfo(AI_ADDRCONFIG) finds nothing,
# and slurmd cannot bind its port. Returns at once when already inside; returns 1 where PID and
# mount namespaces cannot be made here.
own_namespaces() {
  if [ -n "${TUTTI_LAUNCH_INSIDE:-}" ]; then
    if [ "$TUTTI_LAUNCH_INSIDE" = net ]; then
      ip link set lo up
      ip link add eth0 type veth peer name eth1 2>/dev/null &&
        ip addr add 10.231.77.1/24 dev eth0 && ip link set eth0 up && ip link set eth1 up
    fi
    return 0
  fi
  local ns=(unshare --pid --fork --kill-child --mount --mount-proc --propagation private)
  if "${ns[@]}" --net true 2>/dev/null && command -v ip >/dev/null; then
    exec "${ns[@]}" --net env TUTTI_LAUNCH_INSIDE=net "$@"
  fi
  "${ns[@]}" true 2>/dev/null || return 1
  exec "${ns[@]}" env TUTTI_LAUNCH_INSIDE=1 "$@"
}

# scratch NAME: a scratch folder DIR (/tmp/tutti-NAME.*), a TAG for this run's names, the names
# NSA and NSB two_hosts may take, and a trap that at exit ends the script's background jobs (so
# none writes into the folder as it goes), then removes the folder and those namespaces. (A KILL
# runs no trap: the PID namespace still ends every process, the folder and names stay.)
scratch() {
  DIR="$(mktemp -d "/tmp/tutti-$1.XXXXXX")"
  TAG=$$$RANDOM  # $$ is 1 inside own_namespaces
  NSA="${1:0:2}a$TAG" NSB="${1:0:2}b$TAG"
  trap 'end_jobs; ip netns del "$NSA" 2>/dev/null; ip netns del "$NSB" 2>/dev/null; rm -rf "$DIR"' EXIT
}

# end_jobs: TERM to the script's background jobs, KILL to those still there 5 s later.
end_jobs() {
  local jobs_left
  jobs_left="$(jobs -pr)"
  [ -n "$jobs_left" ] || return 0
  # shellcheck disable=SC2086  # one pid a word
  kill $jobs_left 2>/dev/null
  for _ in $(seq 50); do
    [ -n "$(jobs -pr)" ] || return 0
    sleep 0.1
  done
  # shellcheck disable=SC2046
  kill -9 $(jobs -pr) 2>/dev/null
}

# two_hosts NS_A NS_B NET TAG: network namespaces NS_A and NS_B, joined by a veth pair (va$TAG
# in NS_A at NET.1, vb$TAG in NS_B at NET.2; NET is three octets), loopback up in each. Returns
# 1 where network namespaces cannot be made here, 2 where a later step failed. (scratch's trap
# deletes NSA and NSB.)
two_hosts() {
  local a="$1" b="$2" net="$3" tag="$4"
  ip netns add "$a" 2>/dev/null && ip netns add "$b" 2>/dev/null || return 1
  ip link add "va$tag" netns "$a" type veth peer name "vb$tag" netns "$b" || return 2
  ip -n "$a" addr add "$net.1/30" dev "va$tag" && ip -n "$a" link set "va$tag" up &&
    ip -n "$b" addr add "$net.2/30" dev "vb$tag" && ip -n "$b" link set "vb$tag" up &&
    ip -n "$a" link set lo up && ip -n "$b" link set lo up || return 2
}

# free_pair VAR: VAR = a port P of 127.0.0.1 where P and P + 1 are free (torchrun's store may
# take P, tutti's root P + 1; a Slurm cluster's two daemons). Outside the kernel's ephemeral
# range, as tutti-run's: a port bind(0) handed out may go to any connection this machine opens
# before the launch binds it (ctest -j2). Pick it just before the launch.
free_pair() {
  local p
  p="$(python3 -c '
import random, socket, sys
with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
    low, high = map(int, f.read().split())
# Outside the ephemeral range where 1000 ports are there: below it, else above it, else any.
span = (20000, low - 1) if low - 20000 >= 1000 else (high + 1, 65534) if 65534 - high >= 1000 else (1024, 65534)
for _ in range(200):
    p = random.randrange(*span)
    a, b = socket.socket(), socket.socket()
    try:
        a.bind(("127.0.0.1", p)); b.bind(("127.0.0.1", p + 1)); print(p); sys.exit(0)
    except OSError:
        pass
    finally:
        a.close(); b.close()
sys.exit("no free pair of ports")')" || fail "no free pair of ports"
  printf -v "$1" %s "$p"
}

# What each launch runs after the launcher's own words (a launcher started on other hosts by
# the caller itself passes these too).
# shellcheck disable=SC2034  # read by the scripts that source this one
PERF_ARGS=(all_reduce -b 8 -e 1M -f 32 -n 3 -w 1)
# shellcheck disable=SC2034
TRAIN_ARGS=(--epochs 1 --batch 64 --train-limit 4000 --test-limit 500)

# A job started again after a failure: 2 ranks of tutti-train saving every 5 steps, whose rank 1
# fails at step 12 in the first start (TUTTI_TRAINER_FAIL_AT=1:12, which a resumed run ignores).
# The start after it must carry on from step 10 (--auto-resume) to the last checkpoint an
# uninterrupted run (straight_run) writes, byte for byte (check_restarted).
RESTART_ARGS=(--epochs 2 --batch 64 --train-limit 2000 --test-limit 500 --save-every 5)

# straight_run CHECKPOINT LAUNCH...: the uninterrupted run under LAUNCH, 90 s at most.
straight_run() {
  local ck="$1"
  shift
  echo "== $* tutti-train ${RESTART_ARGS[*]} (uninterrupted)"
  timeout 90 "$@" "$BUILD/tutti-train" "${RESTART_ARGS[@]}" --checkpoint "$ck" ||
    fail "the uninterrupted run failed"
}

# check_restarted OUTPUT CHECKPOINT STRAIGHT [LINE...]: the job's output says it started afresh,
# failed at step 12, resumed at step 10 and ended (and holds each LINE); its last checkpoint
# holds STRAIGHT's bytes.
check_restarted() {
  local out="$1" ck="$2" straight="$3" want
  shift 3
  for want in "no checkpoint at $ck yet: starting afresh" \
    "rank 1: failed at step 12 as TUTTI_TRAINER_FAIL_AT asked" "resumed from $ck at step 10" \
    "epoch 2/2" "$@"; do
    grep -qF -- "$want" <<<"$out" || fail "no line '$want' from the restarted job"
  done
  cmp "$straight" "$ck" || fail "the restarted job's last checkpoint differs from the uninterrupted run's"
}

# launched PROGRAM LABEL ARGS_NAME LAUNCH...: runs LAUNCH $BUILD/PROGRAM "${ARGS_NAME[@]}" (90 s
# at most), printing "== LAUNCH LABEL" and what it said; fails unless it exited 0. Its output
# stays in LAST_OUT (for the callers' own checks).
launched() {
  local program="$1" label="$2" out rc
  local -n args="$3"
  shift 3
  echo "== $* $label"
  out="$(timeout 90 "$@" "$BUILD/$program" "${args[@]}" 2>&1)"
  rc=$?
  echo "$out"
  ((rc == 0)) || fail "$program exited with $rc"
  LAST_OUT="$out"
}

# run_perf RANKS LAUNCH...: LAUNCH tutti-perf all_reduce (values checked) as RANKS ranks.
run_perf() {
  local ranks="$1"
  shift
  launched tutti-perf "tutti-perf all_reduce" PERF_ARGS "$@"
  grep -q "# Out of bounds values : 0 OK" <<<"$LAST_OUT" || fail "tutti-perf found wrong values"
  grep -q "host memory: $ranks rank(s) in all" <<<"$LAST_OUT" ||
    fail "tutti-perf did not run $ranks ranks"
}

# run_train LAUNCH...: LAUNCH one epoch of tutti-train (where it was built) as 2 ranks; rank 0
# alone reports.
run_train() {
  [ -x "$BUILD/tutti-train" ] || return 0
  launched tutti-train tutti-train TRAIN_ARGS "$@"
  grep -q "tutti-train: 2 CPU ranks" <<<"$LAST_OUT" || fail "tutti-train did not run 2 ranks"
  [ "$(grep -c "epoch 1/1" <<<"$LAST_OUT")" = 1 ] || fail "not one epoch line (rank 0's alone)"
}
