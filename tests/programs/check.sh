#!/bin/sh
# Runs a test program and checks its exit status and output: check.sh STATUS PROGRAM [ARGS...]
# with EXPECT (a newline-separated list of extended regular expressions every one of which must
# match a line of the output) and SAME=1 (a second run must exit with STATUS too and print the same
# stdout). A line from the doubles saying "misuse", in either run, fails the test: the programs
# use CUDA correctly.
status=$1
shift
out=$(mktemp) && err=$(mktemp) || exit 1
trap 'rm -f "$out" "$err" "$out.2" "$err.2"' EXIT
"$@" >"$out" 2>"$err"
rc=$?
cat "$out" "$err"
if [ "$rc" -ne "$status" ]; then
  echo "check.sh: $1 exited with $rc, expected $status"
  exit 1
fi
if grep -q "misuse" "$err"; then
  echo "check.sh: $1 misused the CUDA doubles (see above)"
  exit 1
fi
printf '%s\n' "$EXPECT" | while IFS= read -r re; do
  [ -z "$re" ] && continue
  if ! cat "$out" "$err" | grep -Eq -- "$re"; then
    echo "check.sh: no line of the output matches: $re"
    exit 1
  fi
done || exit 1
if [ "${SAME:-0}" = 1 ]; then
  "$@" >"$out.2" 2>"$err.2"
  rc=$?
  if [ "$rc" -ne "$status" ]; then
    cat "$out.2" "$err.2"
    echo "check.sh: $1 exited with $rc on its second run, expected $status"
    exit 1
  fi
  if grep -q "misuse" "$err.2"; then
    cat "$err.2"
    echo "check.sh: $1 misused the CUDA doubles on its second run (see above)"
    exit 1
  fi
  if ! cmp -s "$out" "$out.2"; then
    echo "check.sh: a second run printed something else:"
    diff "$out" "$out.2"
    exit 1
  fi
fi
exit 0
