#!/usr/bin/env bash
# Two "hosts" as network namespaces joined by a veth pair: ranks 0-1 on host A, 2-3 on host B.
# The communicator must form across them with nothing assuming loopback, and each rank must
# see 2 of 4 ranks on its own host. Then the whole correctness matrix runs across them: shm
# inside each namespace, tcp over the veth between them. Skips (exit 77) where namespaces
# cannot be made.
set -u
RANK_BIN=$1
tag=t$$
nsA=tutti-a-$tag nsB=tutti-b-$tag
cleanup() { ip netns del "$nsA" 2>/dev/null; ip netns del "$nsB" 2>/dev/null; }
trap cleanup EXIT
if ! ip netns add "$nsA" 2>/dev/null || ! ip netns add "$nsB" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here (needs root and iproute2)"
  exit 77
fi
# A private /30 that exists only between the two namespaces made above.
ip link add "va$tag" netns "$nsA" type veth peer name "vb$tag" netns "$nsB" || exit 1
ip -n "$nsA" addr add 10.231.77.1/30 dev "va$tag" && ip -n "$nsA" link set "va$tag" up
ip -n "$nsB" addr add 10.231.77.2/30 dev "vb$tag" && ip -n "$nsB" link set "vb$tag" up
ip -n "$nsA" link set lo up && ip -n "$nsB" link set lo up

export WORLD_SIZE=4 MASTER_ADDR=10.231.77.1 MASTER_PORT=29400 TUTTI_SECRET=netns-$tag
export NCCL_SOCKET_IFNAME=v TUTTI_BOOTSTRAP_TIMEOUT=20 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP
out=$(mktemp -d)
for r in 0 1 2 3; do
  ns=$nsA; [ $r -ge 2 ] && ns=$nsB
  RANK=$r LOCAL_RANK=$((r % 2)) ip netns exec "$ns" "$RANK_BIN" init >"$out/$r.log" 2>&1 &
done
fail=0
for job in $(jobs -p); do wait "$job" || fail=1; done
for r in 0 1 2 3; do
  echo "--- rank $r"; cat "$out/$r.log"
  grep -q "^ok$" "$out/$r.log" || fail=1
  grep -q "rank $r: host .* 2 of 4 ranks on this host" "$out/$r.log" || { echo "rank $r: wrong host grouping"; fail=1; }
done
grep -q "bootstrap listening on 10.231.77.2" "$out/2.log" || { echo "rank 2 did not listen on host B's address"; fail=1; }
[ $fail = 0 ] && echo "netns: 4 ranks on 2 namespaces formed a communicator"

# The collectives, across the two hosts.
export NCCL_BUFFSIZE=8192 TUTTI_TIMEOUT=60 NCCL_DEBUG_SUBSYS=INIT,NET MASTER_PORT=29410
for r in 0 1 2 3; do
  ns=$nsA; [ $r -ge 2 ] && ns=$nsB
  RANK=$r LOCAL_RANK=$((r % 2)) ip netns exec "$ns" "$RANK_BIN" coll >"$out/c$r.log" 2>&1 &
done
for job in $(jobs -p); do wait "$job" || fail=1; done
for r in 0 1 2 3; do
  echo "--- rank $r (collectives)"; grep -v "NCCL INFO" "$out/c$r.log"
  grep -q "^matrix: .* cases passed on rank $r" "$out/c$r.log" || fail=1
done
grep -q "rank 1 -> rank 2 channel 0 via tcp" "$out/c1.log" || { echo "rank 1 -> 2 did not use tcp"; fail=1; }
grep -q "rank 0 -> rank 1 channel 0 via shm" "$out/c0.log" || { echo "rank 0 -> 1 did not use shm"; fail=1; }
grep -q "tcp transport listening on 10.231.77.2" "$out/c2.log" || { echo "rank 2's tcp listener is not on host B's address"; fail=1; }
rm -rf "$out"
[ $fail = 0 ] && echo "netns: the correctness matrix passed across 2 namespaces (shm inside, tcp between)"
exit $fail
