#!/bin/sh
# Two builds of one program print the same last line: check_pair.sh PROGRAM_A PROGRAM_B [ARGS...]
# runs each with ARGS; each must exit 0 with no line from the doubles saying "misuse" (as
# check.sh), and their last lines on stdout (the checksum) must be equal and not empty.
a=$1
b=$2
shift 2
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
for p in "$a" "$b"; do
  n=$(basename "$p")
  "$p" "$@" >"$dir/$n.out" 2>"$dir/$n.err"
  rc=$?
  cat "$dir/$n.out" "$dir/$n.err"
  if [ "$rc" -ne 0 ]; then
    echo "check_pair.sh: $n exited with $rc, expected 0"
    exit 1
  fi
  if grep -q "misuse" "$dir/$n.err"; then
    echo "check_pair.sh: $n misused the CUDA doubles (see above)"
    exit 1
  fi
done
la=$(tail -n 1 "$dir/$(basename "$a").out")
lb=$(tail -n 1 "$dir/$(basename "$b").out")
echo "--- last lines:"
echo "$la"
echo "$lb"
if [ -z "$la" ] || [ "$la" != "$lb" ]; then
  echo "check_pair.sh: the last lines differ (or are empty)"
  exit 1
fi
exit 0
