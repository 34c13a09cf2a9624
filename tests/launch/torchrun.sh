#!/usr/bin/env bash
# Ranks launched by a real torchrun (PyTorch's elastic launcher; Debian's python3-torch), which
# gives RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and whose
# agent may listen on MASTER_PORT itself: tutti's root takes the next port.
#   torchrun.sh BUILD_DIR 1   one host: the static rendezvous (--master_port), the c10d one
#                             (--rdzv_endpoint; the agent picks MASTER_PORT), and a job that
#                             torchrun restarts whole after a rank failed (--max_restarts 1,
#                             tutti-train --auto-resume): its last checkpoint must hold the
#                             same bytes as an uninterrupted run's
#   torchrun.sh BUILD_DIR 2   two hosts, each a network namespace of its own joined by a veth
#                             pair, an agent on each (--nnodes 2 --node_rank 0|1); tutti-perf,
#                             4 ranks, shm inside a host and tcp between, meets at the first
#                             host's name, a loopback address there (127.0.1.1, as Debian
#                             writes a host's own name); the first host's ranks kept on lo
#                             (NCCL_SOCKET_IFNAME=lo there): every rank refused at once, told
#                             why; tutti-train, 2 ranks, at the first host's address; and a
#                             job both agents start again after the second host's rank failed,
#                             under the c10d rendezvous at the first host's name (each host has a
#                             name of its own, 127.0.1.1 on itself)
# Runs in a PID namespace of its own where it can (root), so every agent and rank it starts ends
# with it, even when killed. Exits 77 (ctest: skipped) without torchrun, or, for two hosts,
# without root, unshare, nsenter or network namespaces.
# shellcheck disable=SC2154  # free_pair sets p1 ... p4 (printf -v)
set -uo pipefail
# shellcheck disable=SC2034  # read by common.sh
BUILD="$1"
HOSTS="${2:-1}"
skip() { echo "skipped: $*"; exit 77; }
for t in torchrun python3; do
  command -v "$t" >/dev/null || skip "no $t (apt-get install python3-torch)"
done
source "$(dirname "$0")/common.sh"
# (one host runs without them where they cannot be made)
own_namespaces "$0" "$@" || ((HOSTS == 1)) || skip "cannot make PID and mount namespaces here"

scratch torchrun
fail() { echo "FAILED: $*"; exit 1; }


# Debian 12's torch 1.13 under Python 3.11 cannot parse its own default "--redirects 0 --tee 0"
# (an IntFlag change), so every launch names them: rank output goes to files under --log_dir
# and, prefixed with the rank ("[default0]:"), to the console. Errors stay on stderr as they are.
# Its agent looks at the ranks every 5 s by default (newer torch: 0.1 s); every 0.5 s here.
TR=(torchrun --redirects 1 --tee 1 --log_dir "$DIR/logs" --monitor_interval 0.5 --no_python)
unset NCCL_COMM_ID MASTER_ADDR MASTER_PORT TUTTI_PORT RANK WORLD_SIZE LOCAL_RANK

if ((HOSTS == 1)); then
  free_pair p1
  run_perf 3 "${TR[@]}" --nnodes 1 --nproc_per_node 3 --master_addr 127.0.0.1 --master_port "$p1"
  free_pair p2
  run_perf 3 "${TR[@]}" --nnodes 1 --nproc_per_node 3 --rdzv_backend c10d \
    --rdzv_endpoint "127.0.0.1:$p2" --rdzv_id "tutti-$TAG"
  free_pair p3
  run_train "${TR[@]}" --nnodes 1 --nproc_per_node 2 --master_port "$p3"
  if [ -n "${LAST_OUT:-}" ]; then
    grep -q "2 local ranks" <<<"$LAST_OUT" || fail "tutti-train did not read LOCAL_WORLD_SIZE"

    # Rank 1 fails at step 12 (common.sh's RESTART_ARGS): torchrun ends rank 0 and starts both
    # again, which continue from step 10, the last checkpoint.
    straight_run "$DIR/straight.ck" "$BUILD/tutti-run" -n 2
    free_pair p4
    echo "== TUTTI_TRAINER_FAIL_AT=1:12 torchrun --max_restarts 1 tutti-train ${RESTART_ARGS[*]} --auto-resume"
    out="$(TUTTI_TRAINER_FAIL_AT=1:12 timeout 120 "${TR[@]}" --nnodes 1 --nproc_per_node 2 \
      --master_port "$p4" --max_restarts 1 "$BUILD/tutti-train" "${RESTART_ARGS[@]}" \
      --checkpoint "$DIR/restarted.ck" --auto-resume 2>&1)"
    rc=$?
    echo "$out"
    ((rc == 0)) || fail "the restarted job exited with $rc"
    check_restarted "$out" "$DIR/restarted.ck" "$DIR/straight.ck"
  else
    echo "== no tutti-train built: the restarted job not run"
  fi
else
  [ "$(id -u)" = 0 ] || skip "network namespaces need root"
  command -v nsenter >/dev/null || skip "no nsenter"
  two_hosts "$NSA" "$NSB" 10.231.79 "$TAG"
  case $? in
    1) skip "cannot create network namespaces here" ;;
    2) fail "the veth pair or its addresses" ;;
  esac
  export NCCL_SOCKET_IFNAME=v  # the veth ends (va..., vb...)
  # The first host's name, as Debian and Ubuntu write a host's own name in its /etc/hosts: a
  # loopback address there (127.0.1.1), its network address on the other host. Each host sees
  # its own file, bind-mounted in a mount namespace of its own.
  # Each host has a name of its own too (a UTS namespace), written the same way in its file.
  FIRST="t${TAG}a" SECOND="t${TAG}b"
  { cat /etc/hosts; echo "127.0.1.1 $FIRST"; echo "10.231.79.2 $SECOND"; } >"$DIR/hosts.a"
  { cat /etc/hosts; echo "10.231.79.1 $FIRST"; echo "127.0.1.1 $SECOND"; } >"$DIR/hosts.b"
  # (nsenter, not `ip netns exec`, which needs a /sys it can mount)
  on_host() {  # on_host NETNS HOSTS_FILE NAME: the command line that runs what follows there
    printf '%s\0' nsenter --net="/var/run/netns/$1" unshare --mount --uts --propagation private \
      sh -c 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"' "$2" "$3"
  }
  mapfile -d '' ON_A < <(on_host "$NSA" "$DIR/hosts.a" "$FIRST")
  mapfile -d '' ON_B < <(on_host "$NSB" "$DIR/hosts.b" "$SECOND")
  port=29500  # a namespace of its own: nothing else listens there
  # The rendezvous by that name: tutti's root must listen where the second host reaches it.
  NODE=(--nnodes 2 --nproc_per_node 2 --master_addr "$FIRST" --master_port "$port")
  # The second host's agent, started first: it waits for the first's store.
  timeout 90 "${ON_B[@]}" "${TR[@]}" "${NODE[@]}" --node_rank 1 "$BUILD/tutti-perf" \
    "${PERF_ARGS[@]}" >"$DIR/host2.out" 2>&1 &
  second=$!
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT run_perf 4 "${ON_A[@]}" "${TR[@]}" "${NODE[@]}" --node_rank 0
  # The first host's ranks (0, 1) link to each other over shm, to the second's (2, 3) over tcp.
  grep -Eq "rank [01] -> rank [01] channel [0-9]+ via shm" <<<"$LAST_OUT" ||
    fail "no shm link inside the first host"
  grep -Eq "rank [01] -> rank [23] channel [0-9]+ via tcp" <<<"$LAST_OUT" ||
    fail "no tcp link to the second host"
  wait "$second"
  rc=$?
  echo "== the second host's agent:"
  cat "$DIR/host2.out"
  # (rank 0 alone prints the table, its count of wrong values summed over every rank)
  ((rc == 0)) || fail "the second host's agent exited with $rc"

  # The first host's ranks kept on lo (NCCL_SOCKET_IFNAME=lo there), the rendezvous at its
  # address: the second host's ranks could not reach them, and every rank hears so at once,
  # not at the ring's deadline.
  echo "== the first host's ranks on lo: refused at once"
  NODE=(--nnodes 2 --nproc_per_node 2 --master_addr 10.231.79.1 --master_port "$port")
  timeout 90 "${ON_B[@]}" "${TR[@]}" "${NODE[@]}" --node_rank 1 "$BUILD/tutti-perf" \
    "${PERF_ARGS[@]}" >"$DIR/host2.out" 2>&1 &
  second=$!
  SECONDS=0
  out="$(NCCL_SOCKET_IFNAME=lo timeout 90 "${ON_A[@]}" "${TR[@]}" "${NODE[@]}" --node_rank 0 \
    "$BUILD/tutti-perf" "${PERF_ARGS[@]}" 2>&1)"
  rc=$?
  wait "$second"
  took=$SECONDS
  grep -a "tutti-perf:" <<<"$out"
  ((rc != 0)) || fail "ranks the others cannot reach were not refused"
  why="rank 0 listens on a loopback address (127.0.0.1:[0-9]*), out of reach of rank 2, which"
  grep -q "$why" <<<"$out" || fail "the first host's ranks were not told why"
  grep -q "$why" "$DIR/host2.out" || { cat "$DIR/host2.out"; fail "the second host's were not"; }
  ((took < 60)) || fail "refused after $took s, not at once"
  if [ -x "$BUILD/tutti-train" ]; then
    NODE=(--nnodes 2 --nproc_per_node 1 --master_addr 10.231.79.1 --master_port "$port")
    timeout 90 "${ON_B[@]}" "${TR[@]}" "${NODE[@]}" --node_rank 1 "$BUILD/tutti-train" \
      "${TRAIN_ARGS[@]}" >"$DIR/host2.out" 2>&1 &
    second=$!
    run_train "${ON_A[@]}" "${TR[@]}" "${NODE[@]}" --node_rank 0
    wait "$second" || { cat "$DIR/host2.out"; fail "the second host's rank failed"; }

    # A job torchrun starts again on both hosts, under the c10d rendezvous at the first host's
    # name (each agent names its host as the host says: the first's name is 127.0.1.1 there,
    # and MASTER_ADDR is that name): rank 1, on the second host, fails at step 12 (common.sh's
    # RESTART_ARGS); each agent starts its rank again, and the job ends as the same job does
    # uninterrupted. (Not as a one-host run: with one rank a host, each rank's BLAS may take
    # both cores, and its sums may round otherwise.)
    # One restart more than the failure needs: under c10d the agent picks MASTER_PORT free as a
    # round starts and tutti's root takes the next port, which another socket of the host may
    # hold by then (seen once, under load: the restarted round failed "cannot host the
    # bootstrap root ... Address already in use", the agents gave up, and the second one
    # waited for a round that never came); such a round fails at once and the agents start
    # another from the checkpoint, with the same end.
    two_host_job() {  # two_host_job NAME CHECKPOINT ENV...: both agents; output in $DIR/NAME.*
      local name="$1" ck="$2" rc rc2
      shift 2
      local job=("${TR[@]}" --nnodes 2 --nproc_per_node 1 --max_restarts 2 --rdzv_backend c10d
        --rdzv_endpoint "$FIRST:$((port + 2))" --rdzv_id "tutti-$TAG-$name" "$BUILD/tutti-train"
        "${RESTART_ARGS[@]}" --checkpoint "$ck" --auto-resume)
      echo "== $* torchrun (2 hosts, c10d) --max_restarts 2 tutti-train ${RESTART_ARGS[*]} --auto-resume"
      env "$@" timeout 150 "${ON_B[@]}" "${job[@]}" >"$DIR/$name.b" 2>&1 &
      local second=$!
      env "$@" timeout 150 "${ON_A[@]}" "${job[@]}" >"$DIR/$name.a" 2>&1
      rc=$?
      wait "$second"
      rc2=$?
      cat "$DIR/$name.a"
      echo "== the second host's agent:"
      cat "$DIR/$name.b"
      ((rc == 0 && rc2 == 0)) || fail "the agents of job $name exited with $rc and $rc2"
    }
    two_host_job straight "$DIR/straight.ck" TUTTI_TRAINER_FAIL_AT=
    two_host_job restarted "$DIR/restarted.ck" TUTTI_TRAINER_FAIL_AT=1:12
    check_restarted "$(cat "$DIR/restarted.a" "$DIR/restarted.b")" "$DIR/restarted.ck" \
      "$DIR/straight.ck"
  fi
fi
echo "torchrun on $HOSTS host(s): PASSED"
