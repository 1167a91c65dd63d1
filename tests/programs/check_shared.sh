#!/bin/sh
# Two replicas on one shared device double, without timing: A holds its peak (--wait-file) while
# B runs; with a device smaller than two peaks B must fail with out-of-memory (status 3), and A
# must complete once let go. Usage: check_shared.sh REPLICA (WLTEST_DEVICE_MEM set by ctest).
replica=$1
dir=$(mktemp -d) || exit 1
export WLTEST_DEVICE_SHM="/wltest-prog-shared-$$"
trap 'rm -rf "$dir"; rm -f "/dev/shm$WLTEST_DEVICE_SHM"' EXIT
"$replica" --iters 2 --peak 40M --wait-file "$dir/go" >"$dir/a.out" 2>&1 &
a=$!
# Wait (bounded by the ctest timeout) until A is at its first peak.
until grep -q "iter 0 peak" "$dir/a.out"; do
  kill -0 "$a" 2>/dev/null || { cat "$dir/a.out"; echo "check_shared.sh: A ended early"; exit 1; }
  sleep 0.05
done
"$replica" --iters 1 --peak 40M >"$dir/b.out" 2>&1
rb=$?
touch "$dir/go"
wait "$a"
ra=$?
echo "--- A (status $ra)"; cat "$dir/a.out"
echo "--- B (status $rb)"; cat "$dir/b.out"
[ "$ra" -eq 0 ] || { echo "check_shared.sh: A failed"; exit 1; }
[ "$rb" -eq 3 ] || { echo "check_shared.sh: B did not run out of memory"; exit 1; }
grep -q "out of memory" "$dir/b.out" || { echo "check_shared.sh: no out-of-memory line"; exit 1; }
exit 0
