#!/usr/bin/env bash
# wavelet-run and `wavelet-trace record` with the real libwavelet.so over the CUDA test doubles
# (tests/doubles), with the nvcc-built programs of tests/programs; one case per ctest test:
#   gate    two wl-prog-replica in gate mode: prefixed output, the program's own results, and
#           the report over both traces (2 processes, the program's allocation counts, the gate used)
#   budget  a budget below twice a replica's peak: ungated (alloc mode) the second replica runs
#           out of memory while the first holds its peak, and wavelet-run exits with its status and
#           names it; gated, replicas with trainer markers complete within the budget
#   signal  one replica SIGKILLed at its peak: 137, named; the other completes; its trace recovered
#   record  `wavelet-trace record` of wl-prog-rt: the trace has the allocations the program counted
# Usage: test_run_doubles.sh CASE WAVELET_RUN WAVELET_TRACE LIBWAVELET DOUBLES_DIR PROG_REPLICA
#        PROG_RT IP_REPLICA WORK_DIR   (LIBWAVELET empty: a sanitizer build, skipped with 77)
set -uo pipefail
case=$1 run=$2 wt=$3 lib=$4 doubles=$5 prog=$6 progrt=$7 ipreplica=$8 work=$9
. "$(dirname "$0")/lib.sh"
if [[ -z $lib ]]; then
  # A sanitized libwavelet.so needs the sanitizer runtime loaded first, which the unsanitized
  # wavelet-run children (sh) do not have.
  echo "skipped: a sanitizer build's libwavelet.so cannot be preloaded into unsanitized programs"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
unset LOCAL_RANK LOCAL_WORLD_SIZE PYTORCH_CUDA_ALLOC_CONF XLA_PYTHON_CLIENT_ALLOCATOR TF_GPU_ALLOCATOR \
  WAVELET_PRELOAD CUDA_VISIBLE_DEVICES
unset WAVELET_MODE WAVELET_GROUP WAVELET_TRACE WAVELET_MEM_LIMIT WAVELET_ALLOC_TIMEOUT_MS
# The doubles as tests/interpose sets them up: the runtime and driver by LD_LIBRARY_PATH, one
# device shared by the replicas (WLTEST_DEVICE_SHM), simulated kernel durations.
export LD_LIBRARY_PATH=$doubles WLTEST_DEVICE_MEM=1G WLTEST_KERNEL_NS=100000
export WLTEST_DEVICE_SHM=/wltest-run-$case-$$ WAVELET_GATE_TIMEOUT_MS=20000
trap 'rm -f "/dev/shm$WLTEST_DEVICE_SHM"' EXIT
export D=$work # for the sh wrappers below
# pre CMD...: CMD's programs on the driver double must have libwavelet.so loaded ahead of it, or
# they exit 97 (WLTEST_EXPECT_PRELOAD, tests/doubles/README.md): a preload the loader could not
# load would leave them running unhooked, printing what they print hooked.
pre() { WLTEST_EXPECT_PRELOAD=$lib "$@"; }
rep() { # rep NAME: `wavelet-trace report --json` of NAME's two traces, into NAME.json
  "$wt" report --json "$work/$1/replica-0.wlt" "$work/$1/replica-1.wlt" >"$work/$1.json" 2>"$work/$1.json.err"
}
jq_py() { # jq_py NAME PYTHON: runs PYTHON with d = NAME's report JSON; its exit status
  python3 -c "import json, sys
d = json.load(open(sys.argv[1]))
$2" "$work/$1.json"
}
allocs_of() { # allocs_of FILE ROLE: what the program said it allocated (calls) in FILE
  sed -n "s/^\[$2\] [a-z-]*: cudaMalloc \([0-9]*\) bytes [0-9]* cudaMallocAsync \([0-9]*\) .*/\1 \2/p" "$1" |
    awk '{print $1 + $2}'
}

case $case in
gate)
  args=(--iters 40 --peak 64M --quiet)
  env -u WLTEST_DEVICE_SHM "$prog" "${args[@]}" >"$work/plain.out" 2>&1
  want=$(sed -n 's/^wl-prog-replica: checksum //p' "$work/plain.out")
  check "without the preload: a checksum" test -n "$want"
  pre "$run" -n 2 --mode gate --trace-dir "$work/gate" -- "$prog" "${args[@]}" >"$work/gate.out" 2>"$work/gate.err"
  rc=$?
  check "gate: exit 0" test $rc -eq 0
  check "gate: each replica's checksum, the same as without the preload" \
    test "$(grep -c "^\[[01]\] wl-prog-replica: checksum $want$" "$work/gate.out")" -eq 2
  check "gate: every line before the report prefixed with its role" python3 -c '
import re, sys
roles = set()
for l in open(sys.argv[1]):
    if l.startswith("wavelet-trace report:"): break
    m = re.match(r"\[([01])\] wl-prog-replica: ", l)
    if not m and l.strip(): print("unprefixed:", l.rstrip()); sys.exit(1)
    if m: roles.add(m.group(1))
sys.exit(roles != {"0", "1"})' "$work/gate.out"
  check "gate: wavelet-run printed the report over both traces" grep -q '^wavelet-trace report: 2 traces$' "$work/gate.out"
  check "gate: ... with the combined wave" grep -q '^rising phases overlapped for .* ms rising' "$work/gate.out"
  n0=$(allocs_of "$work/gate.out" 0) n1=$(allocs_of "$work/gate.out" 1)
  rep gate
  check "gate: JSON: 2 processes, roles 0 and 1, the allocations each program counted ($n0, $n1), complete, no OOM" \
    jq_py gate "p = d['processes']
sys.exit(not (len(p) == 2 and sorted(x['role'] for x in p) == [0, 1] and
    [x['allocs'] for x in sorted(p, key=lambda x: x['role'])] == [$n0, $n1] and
    all(x['allocs'] == x['frees'] and x['complete'] and x['ooms'] == 0 for x in p)))"
  # Without trainer markers the gate is used once the detector has learned the iteration.
  check "gate: JSON: both replicas went through the gate" jq_py gate \
    "sys.exit(not all(x['gate_waits'] >= 1 for x in d['processes']))"
  check "gate: JSON: the combined wave and its rising phases" jq_py gate "c = d['combined']
print('  rising %.3f ms, overlapped %.3f ms' % (c['rising_ms'], c['rising_overlap_ms']))
sys.exit(not (c['rising_ms'] > 0 and 0 <= c['rising_overlap_ms'] <= c['rising_ms'] and
    c['rising_overlapped'] == (c['rising_overlap_ms'] > 0)))"
  ;;

budget)
  # wl-prog-replica --peak 64M: 64 MiB live, 80 MiB mapped in liballoc's 20 MiB chunks.
  budget=120M
  export WAVELET_ALLOC_TIMEOUT_MS=0 # ungated: no waiting for memory, as a GPU refuses at once
  # Without timing: replica 0 holds its peak (--wait-file) until replica 1 has run.
  pre "$run" -n 2 --mode alloc --mem-limit $budget -- sh -c '
if [ "$WAVELET_ROLE" = 0 ]; then exec "$0" --iters 2 --peak 64M --wait-file "$D/go"; fi
peaked() { grep -q "^\[0\] wl-prog-replica: iter 0 peak" "$D/alloc.out"; }
i=0; until peaked || [ $i -ge 400 ]; do sleep 0.05; i=$((i + 1)); done
peaked || echo "replica 0 never reached its peak"
"$0" --iters 2 --peak 64M; rc=$?; : >"$D/go"; exit $rc' "$prog" >"$work/alloc.out" 2>"$work/alloc.err"
  rc=$?
  check "ungated: exit status 3 (wl-prog-replica's out of memory)" test $rc -eq 3
  check "ungated: replica 1 ran out of memory" grep -q '^\[1\] wl-prog-replica: out of memory: iteration 0 ' "$work/alloc.out"
  check "ungated: one line names replica 1 and its status" \
    test "$(grep -c 'replica 1 (pid [0-9]*) failed with exit status 3$' "$work/alloc.err")" -eq 1
  check "ungated: replica 0 completed" grep -q '^\[0\] wl-prog-replica: checksum ' "$work/alloc.out"
  # Gated: without trainer markers the detector needs about 16 iterations before it gates, and
  # until then two replicas under this budget can wait on each other (libsched's deadlock
  # breaker then fails one), so this runs wl-ip-replica, which has the markers, at the same peak
  # (8 layers of 8 MiB).
  export WAVELET_ALLOC_TIMEOUT_MS=5000
  pre "$run" -n 2 --mode gate --mem-limit $budget --trace-dir "$work/gated" -- "$ipreplica" 8 8 8 \
    >"$work/gated.out" 2>"$work/gated.err"
  rc=$?
  check "gated: exit 0, both done" test $rc -eq 0 -a "$(grep -c '^\[[01]\] done 8 ' "$work/gated.out")" -eq 2
  rep gated
  check "gated: JSON: 2 processes of 64 MiB peaks, both gated, no OOM, combined within the budget" \
    jq_py gated "p, c = d['processes'], d['combined']
print('  combined peak %d bytes, rising overlapped %.3f of %.3f ms' % (c['peak_bytes'], c['rising_overlap_ms'], c['rising_ms']))
sys.exit(not (len(p) == 2 and all(x['peak_bytes'] == 64 << 20 and x['gate_waits'] >= 1 and
    x['ooms'] == 0 and x['complete'] for x in p) and c['peak_bytes'] <= 120 << 20))"
  ;;

signal)
  pre "$run" -n 2 --mode gate --trace-dir "$work/sig" -- sh -c 'echo $$ >"$D/pid-$WAVELET_ROLE"
if [ "$WAVELET_ROLE" = 0 ]; then exec "$0" --iters 3 --peak 64M --wait-file "$D/never"; fi
exec "$0" --iters 3 --peak 64M' "$prog" >"$work/sig.out" 2>"$work/sig.err" &
  pid=$!
  peaked() { grep -q '^\[0\] wl-prog-replica: iter 0 peak' "$work/sig.out"; }
  check "signal: replica 0 reached its peak" wait_for 400 peaked
  victim=$(cat "$work/pid-0" 2>/dev/null)
  if [[ -n $victim ]]; then kill -KILL "$victim"; else kill -TERM $pid; fi
  wait $pid
  rc=$?
  check "signal: exit status 137" test $rc -eq 137
  check "signal: one line names replica 0 (pid $victim) and signal 9" \
    test "$(grep -c "replica 0 (pid $victim) was killed by signal 9" "$work/sig.err")" -eq 1
  check "signal: replica 1 completed" grep -q '^\[1\] wl-prog-replica: checksum ' "$work/sig.out"
  # Events not yet flushed when it died come from its rings file; when the 100 ms flusher had
  # written them all, there is nothing to recover and the trace just has no end record.
  check "signal: the report says replica 0 ended without closing its trace" \
    grep -Eq '^ended  *(died \(rings recovered\)|without end record)  *cleanly' "$work/sig.out"
  rep sig
  # At its first peak replica 0 had made its cudaMalloc and 8 activations, none freed.
  check "signal: JSON: replica 0's 9 allocations, none freed, not complete; replica 1 complete" jq_py sig "p = sorted(d['processes'], key=lambda x: x['role'])
print('  replica 0: %d events, %d recovered from its rings' % (p[0]['events'], p[0]['recovered_events']))
sys.exit(not (p[0]['allocs'] == 9 and p[0]['frees'] == 0 and not p[0]['complete'] and
    p[1]['complete'] and p[1]['allocs'] == p[1]['frees'] == 25))"
  ;;

record)
  export WLTEST_KERNEL_NS=20000
  pre "$wt" record -o "$work/rt.wlt" -- "$progrt" 3 1 2 >"$work/rec.out" 2>"$work/rec.err"
  rc=$?
  check "record: exit 0" test $rc -eq 0
  check "record: the program ran to its checksum" grep -q '^wl-prog-rt: checksum ' "$work/rec.out"
  n=$(sed 's/^/[0] /' "$work/rec.out" >"$work/rec.pfx" && allocs_of "$work/rec.pfx" 0)
  check "record: the program counted its allocations" test -n "$n"
  "$wt" report --json "$work/rt.wlt" >"$work/rec.json" 2>"$work/rec.json.err"
  check "record: JSON: $n allocations (as the program counted), a nonzero peak, complete" python3 -c "
import json, sys
d = json.load(open(sys.argv[1])); p = d['processes'][0]
print('  allocs %d, peak %d bytes' % (p['allocs'], p['peak_bytes']))
sys.exit(not (len(d['processes']) == 1 and p['allocs'] == ${n:-0} and p['peak_bytes'] > 0 and
    d['peak_bytes'] > 0 and p['complete']))" "$work/rec.json"
  ;;

*)
  echo "test_run_doubles.sh: unknown case '$case' (expected gate, budget, signal or record)"
  exit 2
  ;;
esac
finish "test_run_doubles $case"
