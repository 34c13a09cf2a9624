#!/usr/bin/env bash
# Every shell script of the tree under shellcheck, warnings and errors (scripts/device-check
# above all: it runs only on a GPU machine, lent to few sessions, and a slip there costs one).
#   tests/lint/shellcheck.sh SOURCE_DIR
# Exits 77 (ctest: skipped) without shellcheck.
set -uo pipefail
ROOT="$1"
command -v shellcheck >/dev/null || { echo "skipped: no shellcheck (apt-get install shellcheck)"; exit 77; }
cd "$ROOT" || exit 1
scripts=()
while IFS= read -r -d '' f; do
  case "$f" in
    *.sh) scripts+=("$f") ;;
    *) head -c 64 "$f" | grep -qE '^#!.*(bash|/sh)' && scripts+=("$f") ;;
  esac
done < <(find scripts .ci tests bench examples -type f \( -name '*.sh' -o -perm -u+x \) -print0)
((${#scripts[@]} >= 10)) || { echo "FAILED: found only ${#scripts[@]} scripts: ${scripts[*]}"; exit 1; }
echo "shellcheck -S warning on ${#scripts[@]} scripts: ${scripts[*]}"
shellcheck -x -P SCRIPTDIR -S warning "${scripts[@]}" || { echo "FAILED"; exit 1; }
echo "PASSED"
