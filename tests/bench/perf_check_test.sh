#!/usr/bin/env bash
# tutti-perf's check and command line:
#  - results made wrong by a library preloaded in front of tutti (wrong_nccl.cc: a result moved
#    one element, a reduce-scatter block of the wrong rank, an all-gather block of the wrong
#    peer, a broadcast or reduce of the wrong root, sends and receives of the wrong peers) are
#    counted on every line of the sweep, with 3 ranks, every op and narrow types, where inputs
#    that repeat every 3 elements or every 3 ranks let them pass;
#  - correct results pass where the expected value must wrap nothing (int8 products over 24
#    ranks), with -z 1, -c 3, -m 3, and every type and op (-d all -o all);
#  - bad flags are refused with a message and exit status 2; -h prints the usage.
#  - a launcher's job of one process runs -t N as threads; of more, refuses -t N.
#   perf_check_test.sh TUTTI_PERF WRONG_NCCL_SO TUTTI_RUN
set -uo pipefail
perf=$1
shim=$2
run=$3
export NCCL_SOCKET_IFNAME=lo
failed=0
fail() {
  echo "FAILED: $*"
  failed=1
}

# wrong MODE COLL ARGS...: every line of the sweep counts wrong values in both columns (or in the
# out-of-place one, where in place is N/A), and the run fails.
wrong() {
  local mode=$1 coll=$2
  shift 2
  local out rc
  out=$(TUTTI_WRONG=$mode LD_PRELOAD=$shim timeout 120 "$perf" "$coll" "$@" 2>&1)
  rc=$?
  local lines missed
  lines=$(grep -cv '^#' <<<"$out")
  missed=$(grep -v '^#' <<<"$out" | awk '$9 == 0 || ($13 != "N/A" && $13 == 0)')
  if [ "$rc" != 1 ] || ! grep -q "Out of bounds values : [1-9][0-9]* FAILED" <<<"$out" ||
    [ "$lines" = 0 ] || [ -n "$missed" ]; then
    fail "$mode $coll $*: exit status $rc (1 wanted), $lines result lines, these with no wrong
value counted:
$missed"
    return
  fi
  echo "caught $mode $coll $* ($lines lines)"
}

sweep=(-b 16 -e 64K -f 8 -t 3 -n 1 -w 0 -o all)
for d in float int8 f8e5m2 uint8; do
  wrong shift all_reduce "${sweep[@]}" -d "$d"
  wrong neighbour reduce_scatter "${sweep[@]}" -d "$d"
done
wrong rank all_gather -b 16 -e 64K -f 8 -t 3 -n 1 -w 0 -d half
wrong root broadcast -b 16 -e 64K -f 8 -t 3 -n 1 -w 0 -d int8 -r 1
wrong root reduce -b 16 -e 64K -f 8 -t 3 -n 1 -w 0 -d bfloat16 -o all -r 2
wrong peer sendrecv -b 16 -e 64K -f 8 -t 3 -n 1 -w 0 -d f8e4m3

# right COLL ARGS...: passes.
right() {
  local out
  if ! out=$(timeout 300 "$perf" "$@" 2>&1) || ! grep -q "Out of bounds values : 0 OK" <<<"$out"
  then
    fail "$*:
$out"
    return
  fi
  echo "passed $*"
}
right all_reduce -b 8 -e 1K -f 128 -t 24 -n 1 -w 0 -d int8 -o prod
right all_reduce -b 8 -e 1K -f 128 -t 24 -n 1 -w 0 -d uint8 -o all
right reduce_scatter -b 8 -e 64K -f 32 -t 3 -n 3 -w 1 -z 1 -c 3 -o all -d bfloat16
right all_gather -b 8 -e 64K -f 32 -t 2 -n 4 -w 1 -m 3 -c 2
right all_reduce -b 8 -e 4K -f 64 -t 5 -n 1 -w 0 -d all -o all -c 1

# refused FLAGS...: exit status 2 and a message naming the problem.
refused() {
  local out rc
  out=$("$perf" all_reduce "$@" 2>&1)
  rc=$?
  [ "$rc" = 2 ] || fail "$*: exit status $rc, not 2"
  grep -q "^tutti-perf: " <<<"$out" || fail "$*: no message: $out"
  echo "refused $*: $(head -1 <<<"$out")"
}
refused -a 7
refused -n 5x
refused -t 2x
refused -w -4
refused -m -3
refused -e 1e30
refused -b 8KB
refused -f abc
refused -G 2
refused -b 1M -e 8
for flags in "-h" "all_reduce --help"; do
  # shellcheck disable=SC2086
  if ! out=$("$perf" $flags 2>&1) || ! grep -q "^usage: tutti-perf" <<<"$out"; then
    fail "$flags: $out"
  fi
done

# NCCL_TESTS_MIN_BW, nccl-tests' health check: an average bus bandwidth under 90% of it fails.
out=$(NCCL_TESTS_MIN_BW=1e12 "$perf" all_reduce -b 8 -e 64K -f 64 -t 2 -n 1 -w 0 2>&1)
rc=$?
if [ "$rc" != 1 ] || ! grep -q "Avg bus bandwidth    : .* FAILED" <<<"$out"; then
  fail "NCCL_TESTS_MIN_BW=1e12: exit status $rc: $out"
fi
if ! out=$(NCCL_TESTS_MIN_BW=0 "$perf" all_reduce -b 8 -e 64K -f 64 -t 2 -n 1 -w 0 2>&1) ||
  ! grep -q "Avg bus bandwidth    : .* OK" <<<"$out"; then
  fail "NCCL_TESTS_MIN_BW=0: $out"
fi

# Under a launcher: every rank fails alike by rank 0's bandwidth, whatever -a says (the job
# fails; rank 0's FAILED line, unless the launcher stopped it as another rank exited first).
if out=$(NCCL_TESTS_MIN_BW=1e12 "$run" -n 2 "$perf" all_reduce -b 8 -e 64K -f 64 -n 1 -w 0 -a 0 \
  2>&1) || ! grep -q "Avg bus bandwidth    : .* FAILED\|exited with status 1" <<<"$out" ||
  grep -q "Avg bus bandwidth    : .* OK" <<<"$out"; then
  fail "NCCL_TESTS_MIN_BW=1e12 under tutti-run: $out"
fi

# A launcher's job of one process runs -t N as threads (srun -n 1 tutti-perf -t 8); of two, it
# refuses -t N.
if ! out=$(RANK=0 WORLD_SIZE=1 "$perf" all_reduce -t 3 -b 8 -e 1K -n 1 -w 0 2>&1) ||
  ! grep -q "host memory: 3 rank(s) in all" <<<"$out"; then
  fail "RANK=0 WORLD_SIZE=1 -t 3: $out"
fi
out=$(RANK=0 WORLD_SIZE=2 "$perf" all_reduce -t 3 -b 8 -e 1K -n 1 -w 0 2>&1)
rc=$?
[ "$rc" = 2 ] && grep -q "each process is one rank" <<<"$out" ||
  fail "RANK=0 WORLD_SIZE=2 -t 3: exit status $rc: $out"

# -f wins over -i whatever their order, as in nccl-tests.
for flags in "-f 4 -i 1K" "-i 1K -f 4"; do
  # shellcheck disable=SC2086
  sizes=$("$perf" all_reduce -b 8 -e 128 $flags -t 1 -n 1 -w 0 -c 0 2>&1 | grep -v '^#' |
    awk '{printf "%s ", $1}')
  [ "$sizes" = "8 32 128 " ] || fail "$flags: sizes $sizes, not 8 32 128"
done

[ "$failed" = 0 ] && echo "tutti-perf check: PASSED"
exit "$failed"
