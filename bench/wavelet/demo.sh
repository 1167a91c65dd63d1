#!/usr/bin/env bash
# make run: two CPU-backend replicas of the residual CNN under a memory limit below twice one
# replica's peak: ungated (colocate) one runs out of memory, in tick-tock both finish; the
# memory waves are plotted with wavelet-trace. Usage: demo.sh [BUILD_DIR] (default build).
set -u
build=${1:-build}
bench=$build/bin/wavelet-bench
trace=$build/bin/wavelet-trace
out=$build/wavelet-demo
steps=${WAVELET_DEMO_STEPS:-24}
common=(--backend cpu --model resnet --batch 32 --test-samples 1000 --seed 1)

rm -rf "$out" && mkdir -p "$out/colocate" "$out/ticktock" || exit 1

echo "== 1. one replica alone, 2 steps, to measure its peak"
json=$("$bench" "${common[@]}" --mode single --steps 2 --quiet --json 2>/dev/null) || {
  echo "wavelet-bench failed on a single replica" >&2
  exit 1
}
peak=$(printf '%s\n' "$json" | sed -n 's/.*"replica_peak_bytes":\([0-9]*\).*/\1/p')
[ -n "$peak" ] && [ "$peak" -gt 0 ] || { echo "no peak_bytes in: $json" >&2; exit 1; }
# 1.6 x the single-replica peak, in whole MiB: less than two peaks, more than one.
limit=$(( (peak * 16 / 10 + 1048575) / 1048576 ))M
echo "single-replica peak: $((peak / 1048576)) MiB; the group limit for two replicas: $limit"

echo
echo "== 2. colocate: two replicas, ungated, one budget of $limit (expected: out of memory)"
# --json: the table still shows (on stderr), and the object says whether a replica ran out of
# memory, which is the outcome wanted; any other failure is not.
"$bench" "${common[@]}" --mode colocate --replicas 2 --steps "$steps" --mem-limit "$limit" \
  --trace-dir "$out/colocate" --json >"$out/colocate.json"
colo=$?
colo_oom=no
grep -q '"status":"OOM"' "$out/colocate.json" && colo_oom=yes

echo
echo "== 3. ticktock: the same two replicas gated by libsched (expected: both finish)"
"$bench" "${common[@]}" --mode ticktock --replicas 2 --steps "$steps" --mem-limit "$limit" \
  --trace-dir "$out/ticktock"
tick=$?

echo
for m in colocate ticktock; do
  if [ -x "$trace" ]; then
    "$trace" report "$out/$m"/replica-*.wlt --svg "$out/$m.svg" >"$out/$m.report.txt" 2>&1 &&
      echo "$m: memory waves in $out/$m.svg (report: $out/$m.report.txt)"
  fi
done
if [ "$colo" -eq 1 ] && [ "$colo_oom" = yes ] && [ "$tick" -eq 0 ]; then
  echo "as expected: colocate ran out of memory under $limit, ticktock finished within it"
  exit 0
fi
echo "unexpected: colocate exit $colo with a replica out of memory: $colo_oom (expected exit 1" \
  "and yes), ticktock exit $tick (expected 0)" >&2
exit 1
