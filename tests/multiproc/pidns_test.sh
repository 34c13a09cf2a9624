#!/usr/bin/env bash
# Ranks in pid namespaces of their own on one host -- containers that share the host's network
# and /dev/shm (docker --network=host --ipc=host) -- are each pid 1, so their pids alone name no
# process. They must still link through shared memory (same host) and pass the host-buffer
# matrix. Skips (exit 77) where pid namespaces cannot be made (needs root).
set -u
RUN_BIN=$1 RANK_BIN=$2
if ! unshare --pid --fork true 2>/dev/null; then
  echo "SKIP: cannot create pid namespaces here (needs root and util-linux's unshare)"
  exit 77
fi
out=$(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT TUTTI_MATRIX_FILTER='AllReduce float' \
  timeout 120 "$RUN_BIN" -n 3 unshare --pid --fork "$RANK_BIN" coll 2>&1)
status=$?
fail() {
  echo "$out"
  echo "FAILED: $*"
  exit 1
}
[ $status -eq 0 ] || fail "exit status $status"
for r in 0 1 2; do
  grep -q "cases passed on rank $r" <<<"$out" || fail "rank $r did not pass its cases"
  # Each rank is pid 1 in its namespace ("host:pid:tid" in its log lines).
  grep -q "^\[rank $r\] [^: ]*:1:" <<<"$out" || fail "rank $r is not pid 1 in a namespace of its own"
done
links=$(grep -c "via shm" <<<"$out")
[ "$links" -gt 0 ] || fail "no link went through shared memory"
! grep -q "via tcp" <<<"$out" || fail "a link between ranks of one host went through tcp"
echo "pid namespaces: 3 ranks, each pid 1, linked through shared memory ($links links) and passed"
