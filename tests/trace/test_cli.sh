#!/usr/bin/env bash
# wavelet-trace on the golden traces: the JSON report against the generator's expectations, the
# SVG through xmllint, the Perfetto and CSV files through python3, the capacity advice, and every
# kind of bad input (one error line naming the file and the byte, exit status 2).
# Usage: test_cli.sh WAVELET_TRACE GEN_GOLDEN GOLDEN_DIR WORK_DIR
set -euo pipefail
wt=$1 gen=$2 golden=$3 work=$4
for tool in python3 xmllint; do
  if ! command -v "$tool" >/dev/null; then
    echo "test_cli: $tool is missing (scripts/setup.sh installs it): skipped"
    exit 77
  fi
done
rm -rf "$work"
mkdir -p "$work"
fail=0
check() { # check NAME COMMAND...: runs the command, counts a failure
  if "${@:2}"; then echo "ok   $1"; else echo "FAIL $1"; fail=$((fail + 1)); fi
}

"$gen" --expect >"$work/expect.json"

# 1. the table, and JSON values equal to what the goldens were made with
"$wt" report "$golden/markers.wlt" >"$work/table.txt"
check "table has the summary rows" grep -q "^iterations .*12 (markers" "$work/table.txt"
check "table has the advice" grep -q "replicas that fit with tick-tock" "$work/table.txt"
for g in markers wave; do
  "$wt" report "$golden/$g.wlt" --json >"$work/$g.json"
  check "$g: report JSON matches the golden's making" python3 - "$work/$g.json" "$work/expect.json" "$g.wlt" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); e = json.load(open(sys.argv[2]))[sys.argv[3]]
p = r["processes"][0]
bin_ms = p["bin_width_us"] / 1000
tol = 1e-3 if e["markers"] else 2 * bin_ms + 1e-3
checks = [
    ("peak_bytes", r["peak_bytes"] == e["peak_bytes"]),
    ("trough_bytes", r["trough_bytes"] == e["trough_bytes"]),
    ("iterations", r["iterations"] == e["iterations"]),
    ("period_ms", abs(r["period_ms"] - e["period_ms"]) <= tol),
    ("period_spread_ms", abs(p["period_spread_ms"] - e["period_spread_ms"]) <= tol),
    ("physical_peak_bytes", p["physical_peak_bytes"] == e["physical_peak_bytes"]),
    ("events", p["events"] == e["events"]),
    ("gate_waits", p["gate_waits"] == e["gate_waits"]),
    ("gate_wait_ms", abs(p["gate_wait_ms"] - e["gate_wait_ms"]) < 1e-3),
    ("pid", p["pid"] == e["pid"]),
    ("complete", p["complete"] is True),
]
if e["markers"]:
    checks += [("source", p["iteration_source"] == "markers"),
               ("forward_ms", abs(p["forward_ms"] - e["forward_ms"]) < 1e-3),
               ("backward_ms", abs(p["backward_ms"] - e["backward_ms"]) < 1e-3)]
else:
    checks += [("source", p["iteration_source"] == "wave"),
               ("forward_ms", abs(p["forward_ms"] - e["peak_offset_ms"]) <= tol),
               ("confidence", p["confidence"] >= 0.8)]
bad = [n for n, ok in checks if not ok]
if bad: print("mismatch:", bad, json.dumps(p)); sys.exit(1)
PY
done

# 2. several traces: the combined wave, no overlap of rising phases, best offsets
"$wt" report "$golden/pair0.wlt" "$golden/pair1.wlt" --json >"$work/pair.json"
check "pair: combined wave and overlap" python3 - "$work/pair.json" "$work/expect.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); e = json.load(open(sys.argv[2]))
c = r["combined"]; e0 = e["pair0.wlt"]
ok = (len(r["processes"]) == 2 and c["rising_overlapped"] is False and c["rising_overlap_ms"] == 0
      and c["rising_resolution_us"] is None
      and abs(c["rising_ms"] - 2 * 12 * e0["forward_ms"]) <= 0.01 * 2 * 12 * e0["forward_ms"]
      and e0["peak_bytes"] < c["peak_bytes"] < 2 * e0["peak_bytes"]
      and r["peak_bytes"] == c["peak_bytes"] and r["iterations"] == 24
      and c["physical_peak_bytes"] == sum(p["physical_peak_bytes"] for p in r["processes"])
      and c["best_offsets_ms"][0] == 0 and abs(c["best_offsets_ms"][1] - 50) <= 10)
if not ok: print(json.dumps(c)); sys.exit(1)
PY
"$wt" report "$golden/pair0.wlt" "$golden/pair1.wlt" >"$work/pair.txt"
check "pair: table says they never overlapped" grep -q "never overlapped" "$work/pair.txt"

# 2a. the table cuts nothing: a value longer than the old 23-character columns is whole, and the
# next column starts after it
long=a-trace-whose-name-is-longer-than-a-column.wlt
cp "$golden/pair0.wlt" "$work/$long"
"$wt" report "$work/$long" "$golden/pair1.wlt" >"$work/long.txt"
check "table: a long value is not cut" grep -Eq "^file +$long +pair1.wlt" "$work/long.txt"

# 2b. a trace without allocations has no live peak: no time for it either (it was 0 - first
# event, unsigned: 18446744072709.6 ms)
"$gen" --launches-only "$work/launches.wlt" >/dev/null
"$wt" report "$work/launches.wlt" >"$work/launches.txt"
"$wt" report "$work/launches.wlt" --json >"$work/launches.json"
check "no allocations: the table's live peak is '-'" grep -Eq '^live peak +- *$' "$work/launches.txt"
check "no allocations: JSON peak_time_ms is null" python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["processes"][0]
sys.exit(not (p["peak_bytes"] == 0 and p["peak_time_ms"] is None and p["events"] == 100))' \
  "$work/launches.json"

# 3. capacity advice: from the header (2 GiB), and from --capacity
check "capacity: from the header, and --capacity" python3 - "$wt" "$golden/markers.wlt" "$work/expect.json" <<'PY'
import json, subprocess, sys
wt, f, e = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))["markers.wlt"]
def rep(*a): return json.loads(subprocess.run([wt, "report", f, "--json", *a], check=True, capture_output=True).stdout)
h = rep()["capacity"]
ok = h["source"] == "trace header" and h["capacity_bytes"] == e["capacity_bytes"]
ok &= h["replicas_without"] == e["capacity_bytes"] // e["peak_bytes"]
ok &= h["replicas_ticktock"] >= h["replicas_without"] and h["combined_peak_bytes"] <= h["capacity_bytes"]
ok &= len(h["offsets_ms"]) == h["replicas_ticktock"] and h["offsets_ms"][0] == 0
ok &= "max(P" in h["model"] and h["throughput_ratio_ticktock"] >= h["throughput_ratio_without"] > 0
cap = 2 * e["peak_bytes"] - 1  # two aligned replicas do not fit, two shifted ones do
o = rep("--capacity", str(cap))["capacity"]
ok &= o["source"] == "option" and o["replicas_without"] == 1 and o["replicas_ticktock"] == 2
b = rep("--capacity", str(cap), "--busy", "0.5")["capacity"]
ok &= b["busy"] == 0.5 and b["throughput_ratio_ticktock"] > o["throughput_ratio_ticktock"]
if not ok: print(h, o, b); sys.exit(1)
PY

# 4. the SVG: valid XML with the expected series
"$wt" report "$golden/pair0.wlt" "$golden/pair1.wlt" --svg "$work/pair.svg" >/dev/null
check "svg: xmllint accepts it" xmllint --noout "$work/pair.svg"
check "svg: the series, shading, budget and axes" python3 - "$work/pair.svg" <<'PY'
import sys, xml.etree.ElementTree as ET
ns = {"s": "http://www.w3.org/2000/svg"}
t = ET.parse(sys.argv[1]).getroot()
ids = {e.get("id") for e in t.iter() if e.get("id")}
need = {"live-0", "live-1", "physical-0", "physical-1", "budget-0", "budget-1", "live-combined", "budget-combined"}
cls = [e.get("class") for e in t.iter()]
labels = " ".join(e.text or "" for e in t.iter("{http://www.w3.org/2000/svg}text"))
pts = [p for p in t.iter("{http://www.w3.org/2000/svg}polyline") if p.get("id") == "live-0"][0].get("points").split()
ok = need <= ids and "forward" in cls and "backward" in cls and " ms" in labels
ok &= any(u in labels for u in (" GiB", " MiB")) and "memory (" in labels and "time since" in labels
ok &= "budget" in labels and len(pts) > 100
if not ok: print(sorted(ids), set(cls), labels[:300], len(pts)); sys.exit(1)
PY

# 5. the Perfetto file: JSON with counter tracks, phase slices and gate waits
"$wt" report "$golden/pair0.wlt" "$golden/pair1.wlt" --perfetto "$work/pair.perfetto.json" >/dev/null
check "perfetto: tracks and slices" python3 - "$work/pair.perfetto.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); ev = d["traceEvents"]
def has(ph, name, pid=None): return any(e["ph"] == ph and e["name"] == name and (pid is None or e["pid"] == pid) for e in ev)
ok = all(has("C", "live bytes", p) and has("C", "physical bytes", p) and has("X", "forward", p)
         and has("X", "backward", p) and has("X", "gate wait", p) for p in (2001, 2002))
ok &= has("C", "combined live bytes") and has("M", "process_name", 2001)
ok &= sum(1 for e in ev if e["ph"] == "X" and e["name"] == "forward" and e["pid"] == 2001) == 12
ok &= all(e["ts"] >= 0 for e in ev if "ts" in e) and all(e.get("dur", 0) >= 0 for e in ev)
if not ok: print(len(ev)); sys.exit(1)
PY

# 6. the CSV: one header, rows per process, the peak among them
"$wt" report "$golden/markers.wlt" --csv "$work/markers.csv" >/dev/null
check "csv: columns and the peak" python3 - "$work/markers.csv" "$work/expect.json" <<'PY'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1]))); e = json.load(open(sys.argv[2]))["markers.wlt"]
ok = len(rows) > 1000 and max(int(r["live_max_bytes"]) for r in rows) == e["peak_bytes"]
ok &= {"forward", "backward"} <= {r["phase"] for r in rows} and rows[0]["pid"] == str(e["pid"])
if not ok: print(len(rows), rows[:2]); sys.exit(1)
PY

# 7. bad input: exit 2 and one line naming the file and the byte offset
bad() { # bad NAME FILE OFFSET_PATTERN [extra args]
  local name=$1 file=$2 pat=$3
  shift 3
  set +e
  "$wt" report "$file" "$@" >"$work/out.txt" 2>"$work/err.txt"
  local rc=$?
  set -e
  local lines
  lines=$(wc -l <"$work/err.txt")
  if [[ $rc -eq 2 && $lines -eq 1 ]] && grep -q -- "$file: byte $pat" "$work/err.txt"; then
    echo "ok   bad input: $name ($(cat "$work/err.txt"))"
  else
    echo "FAIL bad input: $name: rc $rc, $lines lines: $(cat "$work/err.txt")"
    fail=$((fail + 1))
  fi
}
bad "missing file" "$work/does-not-exist.wlt" "0: cannot open"
head -c 5000 "$golden/markers.wlt" >"$work/truncated.wlt"
bad "truncated" "$work/truncated.wlt" "5000: truncated"
cp "$golden/markers.wlt" "$work/corrupt.wlt"
printf '\x5a' | dd of="$work/corrupt.wlt" bs=1 seek=20000 conv=notrunc status=none
bad "corrupted" "$work/corrupt.wlt" "[0-9]*: block checksum mismatch"
printf 'time,bytes\n0,1\n' >"$work/foreign.wlt"
bad "foreign" "$work/foreign.wlt" "0: not a Wavelet trace"
: >"$work/empty.wlt"
bad "empty" "$work/empty.wlt" "0: empty file"
bad "directory" "$work" "0: is a directory"
head -c 100 "$golden/markers.wlt" >"$work/short-header.wlt"
bad "cut in the header" "$work/short-header.wlt" "100: truncated"

# a crash's cut: --partial reports what came before it, with a warning
set +e
"$wt" report "$work/truncated.wlt" --partial --json >"$work/partial.json" 2>"$work/partial.err"
rc=$?
set -e
check "partial: exit 0 and a warning naming the cut" test $rc -eq 0
check "partial: warning" grep -q "truncated.wlt: byte 5000: truncated" "$work/partial.err"
check "partial: JSON says truncated" python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["processes"][0]; sys.exit(not (p["truncated"] and p["events"] > 0))' "$work/partial.json"

# record without a preload to find (tests/run covers record itself); usage errors
set +e
WAVELET_PRELOAD=$work/nowhere.so "$wt" record -o "$work/x.wlt" -- true 2>"$work/rec.err"; rc_rec=$?
"$wt" report 2>/dev/null; rc_none=$?
"$wt" report "$golden/markers.wlt" --svg 2>/dev/null; rc_noarg=$?
"$wt" report "$golden/markers.wlt" --capacity lots 2>/dev/null; rc_cap=$?
"$wt" frobnicate 2>/dev/null; rc_cmd=$?
set -e
check "record: exit 1" test $rc_rec -eq 1
check "record: one clear line" test "$(cat "$work/rec.err")" = "wavelet: wavelet-trace: record needs libwavelet.so and found none (WAVELET_PRELOAD=$work/nowhere.so: no such file); build the 'wavelet' target, or give --preload PATH or WAVELET_PRELOAD"
check "usage errors exit 2" test "$rc_none$rc_noarg$rc_cap$rc_cmd" = "2222"

if [[ $fail -ne 0 ]]; then
  echo "test_cli: $fail checks failed"
  exit 1
fi
echo "test_cli: all checks passed"
