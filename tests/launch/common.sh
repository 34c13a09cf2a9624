# shellcheck shell=bash
# Sourced by the launcher tests: runs tutti-perf and tutti-train under a launcher and checks
# what every launch must give. The caller defines fail() (print, clean up, exit 1).

# run_perf RANKS LAUNCH...: LAUNCH tutti-perf all_reduce (values checked) as RANKS ranks.
run_perf() {
  local ranks="$1" out rc
  shift
  echo "== $* tutti-perf all_reduce"
  out="$(timeout 90 "$@" "$BUILD/tutti-perf" all_reduce -b 8 -e 1M -f 32 -n 3 -w 1 2>&1)"
  rc=$?
  echo "$out"
  ((rc == 0)) || fail "tutti-perf exited with $rc"
  grep -q "# Out of bounds values : 0 OK" <<<"$out" || fail "tutti-perf found wrong values"
  grep -q "host memory: $ranks rank(s) in all" <<<"$out" || fail "tutti-perf did not run $ranks ranks"
}

# run_train LAUNCH...: LAUNCH one epoch of tutti-train (where it was built) as 2 ranks; rank 0
# alone reports.
run_train() {
  [ -x "$BUILD/tutti-train" ] || return 0
  local out rc
  echo "== $* tutti-train"
  out="$(timeout 90 "$@" "$BUILD/tutti-train" --epochs 1 --batch 64 --train-limit 4000 \
    --test-limit 500 2>&1)"
  rc=$?
  echo "$out"
  ((rc == 0)) || fail "tutti-train exited with $rc"
  grep -q "tutti-train: 2 CPU ranks" <<<"$out" || fail "tutti-train did not run 2 ranks"
  [ "$(grep -c "epoch 1/1" <<<"$out")" = 1 ] || fail "not one epoch line (rank 0's alone)"
  # shellcheck disable=SC2034  # for the caller's own checks
  LAST_OUT="$out"
}
