#!/usr/bin/env bash
# wavelet-run and `wavelet-trace record` as a user runs them: roles and environment, prefixed
# output without torn lines, a failing replica, one killed by a signal, SIGTERM forwarding and the
# second signal, traces and their report, torchrun mode, bad arguments, a missing preload.
# Usage: test_run.sh WAVELET_RUN WAVELET_TRACE WR_REPLICA PRELOAD_STUB WORK_DIR [REAL_PRELOAD]
set -uo pipefail
run=$1 wt=$2 replica=$3 stub=$4 work=$5 real=${6:-}
rm -rf "$work"
mkdir -p "$work"
. "$(dirname "$0")/lib.sh"
unset LOCAL_RANK LOCAL_WORLD_SIZE PYTORCH_CUDA_ALLOC_CONF XLA_PYTHON_CLIENT_ALLOCATOR TF_GPU_ALLOCATOR \
  WAVELET_PRELOAD CUDA_VISIBLE_DEVICES
# In sanitizer builds the stand-in replica has ASan linked, and the stub preload comes before it.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0

# 1. two replicas: roles, environment, placement, and many long lines on both streams that must
# come out whole and prefixed with the right role
cat >"$work/chatty.sh" <<'EOF'
# what a member that died inside the group would leave behind: its segment
[ -d /dev/shm ] && : >"/dev/shm/wavelet-$WAVELET_GROUP"
echo "env role=$WAVELET_ROLE waves=$WAVELET_WAVES group=$WAVELET_GROUP mode=$WAVELET_MODE"
echo "env preload=$LD_PRELOAD conf=$PYTORCH_CUDA_ALLOC_CONF"
# (the affinity as the kernel reports it: gVisor's /proc/self/status has no Cpus_allowed_list)
echo "cpus $(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')"
pad=$(printf '%0300d' 0)
i=0
while [ $i -lt 1500 ]; do
  echo "line role=$WAVELET_ROLE n=$i $pad end"
  echo "errline role=$WAVELET_ROLE n=$i $pad end" >&2
  i=$((i + 1))
done
EOF
"$run" -n 2 --preload "$stub" -- sh "$work/chatty.sh" >"$work/two.out" 2>"$work/two.err"
rc=$?
check "two replicas: exit 0" test $rc -eq 0
check "two replicas: roles and K" grep -q '^\[1\] env role=1 waves=2 group=wr-' "$work/two.out"
check "two replicas: mode gate by default" grep -q '^\[0\] env role=0 waves=2 .*mode=gate$' "$work/two.out"
g0=$(sed -n 's/^\[0\] env .*group=\([^ ]*\) .*/\1/p' "$work/two.out")
g1=$(sed -n 's/^\[1\] env .*group=\([^ ]*\) .*/\1/p' "$work/two.out")
check "two replicas: one group" test -n "$g0" -a "$g0" = "$g1"
check "two replicas: the preload" grep -q "^\[0\] env preload=$(realpath "$stub") conf=backend:cudaMallocAsync$" "$work/two.out"
check "two replicas: the allocator note, once" test "$(grep -c 'set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync' "$work/two.err")" -eq 1
check "two replicas: a group left behind is removed" test -n "$g0" -a ! -e "/dev/shm/wavelet-$g0"
check "output: every stdout line whole and prefixed" python3 - "$work/two.out" "$work/two.err" <<'PY'
import re, sys
for path, word in ((sys.argv[1], "line"), (sys.argv[2], "errline")):
    nxt = {0: 0, 1: 0}
    for l in open(path):
        if l.startswith("wavelet:"): continue
        m = re.fullmatch(r"\[(\d)\] (\w+) (.*)\n", l)
        if not m: print("bad line", repr(l[:80])); sys.exit(1)
        r = int(m.group(1))
        if m.group(2) != word: continue
        m2 = re.fullmatch(r"role=(\d) n=(\d+) 0{300} end", m.group(3))
        if not m2 or int(m2.group(1)) != r or int(m2.group(2)) != nxt[r]:
            print("torn or misattributed", repr(l[:80])); sys.exit(1)
        nxt[r] += 1
    if nxt != {0: 1500, 1: 1500}: print(path, nxt); sys.exit(1)
PY
c0=$(sed -n 's/^\[0\] cpus //p' "$work/two.out")
c1=$(sed -n 's/^\[1\] cpus //p' "$work/two.out")
if [[ $(nproc) -ge 2 ]]; then
  check "placement: disjoint CPUs ($c0 | $c1)" python3 -c '
import sys
def s(x):
    r = set()
    for p in x.split(","):
        a, _, b = p.partition("-"); r |= set(range(int(a), int(b or a) + 1))
    return r
a, b = s(sys.argv[1]), s(sys.argv[2]); sys.exit(not (a and b and not a & b))' "$c0" "$c1"
fi
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$run" -n 1 --mode off -- \
  sh -c 'echo "conf=$PYTORCH_CUDA_ALLOC_CONF waves=${WAVELET_WAVES:-unset} pre=${LD_PRELOAD:-none}"' \
  >"$work/keep.out" 2>"$work/keep.err"
check "a set PYTORCH_CUDA_ALLOC_CONF is kept; mode off needs no preload" \
  grep -qx '\[0\] conf=expandable_segments:True waves=unset pre=none' "$work/keep.out"
check "  ... and the note does not name it" test "$(grep -c 'PYTORCH_CUDA_ALLOC_CONF' "$work/keep.err")" -eq 0
PYTORCH_CUDA_ALLOC_CONF=x XLA_PYTHON_CLIENT_ALLOCATOR=bfc TF_GPU_ALLOCATOR=y "$run" -n 1 --mode off -- \
  sh -c 'echo "$PYTORCH_CUDA_ALLOC_CONF $XLA_PYTHON_CLIENT_ALLOCATOR $TF_GPU_ALLOCATOR"' \
  >"$work/keep3.out" 2>"$work/keep3.err"
check "the frameworks' allocator settings are kept, silently" \
  grep -qx '\[0\] x bfc y' "$work/keep3.out"
check "  ... and no note" test ! -s "$work/keep3.err"
"$run" -n 1 --mode off -- sh -c 'echo "$XLA_PYTHON_CLIENT_ALLOCATOR $TF_GPU_ALLOCATOR"' \
  >"$work/fw.out" 2>"$work/fw.err"
check "JAX's and TensorFlow's allocators made to allocate on demand" \
  grep -qx '\[0\] platform cuda_malloc_async' "$work/fw.out"
"$run" -n 2 --mode off --group wr-test-given --mem-limit 90% --gpu 0 -- \
  sh -c 'echo "$WAVELET_GROUP $WAVELET_MEM_LIMIT $CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER"' \
  >"$work/given.out" 2>/dev/null
check "--group, --mem-limit, --gpu" test "$(grep -c '^\[[01]\] wr-test-given 90% 0 PCI_BUS_ID$' "$work/given.out")" -eq 2

# 2. a failing replica: its status, and one line naming it
"$run" -n 3 --mode off -- sh -c 'sleep 0.$WAVELET_ROLE; [ $WAVELET_ROLE = 1 ] && exit 3; exit 0' \
  >/dev/null 2>"$work/fail.err"
rc=$?
check "failure: exit status 3 passed through" test $rc -eq 3
check "failure: one line names the replica" test "$(grep -c 'replica 1 (pid [0-9]*) failed with exit status 3$' "$work/fail.err")" -eq 1

# 3. a replica killed by a signal: 128+9
"$run" -n 2 --mode off -- sh -c '[ $WAVELET_ROLE = 0 ] && kill -9 $$; sleep 0.2' \
  >/dev/null 2>"$work/kill.err"
rc=$?
check "signal: exit status 137" test $rc -eq 137
check "signal: the line names replica 0 and signal 9" grep -q 'replica 0 (pid [0-9]*) was killed by signal 9' "$work/kill.err"

# 4. SIGTERM reaches every replica (each traps it and exits 7); a second signal kills
cat >"$work/trap.sh" <<'EOF'
trap 'echo "got TERM"; exit 7' TERM
: >"$READY/$WAVELET_ROLE"
while :; do sleep 0.05; done
EOF
# has_files DIR N (a glob, not ls: gVisor's runsc, where make test-gvisor runs this, fails ls
# with EINVAL)
has_files() {
  local f=("$1"/*)
  [[ -e ${f[0]} && ${#f[@]} -ge $2 ]]
}
shm_has() { compgen -G "/dev/shm/$1*" >/dev/null; } # shm_has PREFIX
wait_ready() { wait_for 200 has_files "$1" "$2"; } # wait_ready DIR N
mkdir -p "$work/ready1"
READY=$work/ready1 "$run" -n 2 --mode off -- sh "$work/trap.sh" >"$work/term.out" 2>"$work/term.err" &
pid=$!
wait_ready "$work/ready1" 2
kill -TERM $pid
wait $pid
rc=$?
check "SIGTERM: forwarded, replicas' status 7" test $rc -eq 7
check "SIGTERM: both replicas saw it" test "$(grep -c '^\[[01]\] got TERM$' "$work/term.out")" -eq 2
cat >"$work/stubborn.sh" <<'EOF'
trap 'echo "ignoring TERM"' TERM
: >"$READY/$WAVELET_ROLE"
while :; do sleep 0.05; done
EOF
mkdir -p "$work/ready2"
READY=$work/ready2 "$run" -n 2 --mode off -- sh "$work/stubborn.sh" >"$work/stub.out" 2>"$work/stub.err" &
pid=$!
wait_ready "$work/ready2" 2
kill -TERM $pid
for _ in $(seq 100); do
  [[ $(grep -c 'ignoring TERM' "$work/stub.out") -ge 2 ]] && break
  sleep 0.05
done
kill -TERM $pid
wait $pid
rc=$?
check "second signal: the replicas are killed (137)" test $rc -eq 137
check "second signal: said so" grep -q 'second signal: killing the replicas' "$work/stub.err"

# SIGHUP (a closed terminal or ssh session) and the user signals are forwarded too, and the
# supervisor still removes its group; a hang-up killed it at once before, leaving the replicas
# and the group behind.
cat >"$work/hup.sh" <<'EOF'
trap 'echo "got HUP"; exit 5' HUP
trap 'echo "got USR1"; exit 6' USR1
: >"/dev/shm/wavelet-$WAVELET_GROUP" # as a member's join would have made it
: >"$READY/$WAVELET_ROLE"
while :; do sleep 0.05; done
EOF
for sig in HUP USR1; do
  mkdir -p "$work/ready-$sig"
  READY=$work/ready-$sig "$run" -n 2 --mode alloc --preload "$stub" -- sh "$work/hup.sh" \
    >"$work/$sig.out" 2>"$work/$sig.err" &
  pid=$!
  wait_ready "$work/ready-$sig" 2
  check "SIG$sig: the group was made" shm_has "wavelet-wr-$pid-"
  kill -$sig $pid
  wait $pid
  rc=$?
  want=$([[ $sig = HUP ]] && echo 5 || echo 6)
  check "SIG$sig: forwarded, replicas' status $want" test $rc -eq "$want"
  check "SIG$sig: both replicas saw it" test "$(grep -c "^\[[01]\] got $sig\$" "$work/$sig.out")" -eq 2
  shm_has "wavelet-wr-$pid-"
  check "SIG$sig: the group is removed" test $? -ne 0
done

# an exit status above 128 is not a signal
"$run" -n 1 --mode off -- sh -c 'exit 200' >/dev/null 2>"$work/e200.err"
rc=$?
check "exit 200: passed through, named as a status" \
  test $rc -eq 200 -a "$(grep -c 'replica 0 (pid [0-9]*) failed with exit status 200$' "$work/e200.err")" -eq 1

# 5. --trace-dir: each replica writes DIR/replica-<role>.wlt, and the report follows
"$run" -n 2 --mode trace --preload "$stub" --trace-dir "$work/traces" -- "$replica" \
  >"$work/trace.out" 2>"$work/trace.err"
rc=$?
check "trace-dir: exit 0" test $rc -eq 0
check "trace-dir: both traces" test -s "$work/traces/replica-0.wlt" -a -s "$work/traces/replica-1.wlt"
check "trace-dir: WAVELET_TRACE per role" grep -q "^\[1\] role 1 wrote 280 events to $work/traces/replica-1.wlt$" "$work/trace.out"
check "trace-dir: the report over both" grep -q '^wavelet-trace report: 2 traces' "$work/trace.out"
check "trace-dir: the combined wave" grep -q '^combined wave: peak' "$work/trace.out"
check "trace-dir: same as wavelet-trace report" python3 - "$work/trace.out" "$wt" "$work/traces" <<'PY'
import subprocess, sys
out = open(sys.argv[1]).read()
rep = subprocess.run([sys.argv[2], "report", sys.argv[3] + "/replica-0.wlt", sys.argv[3] + "/replica-1.wlt"],
                     capture_output=True, text=True).stdout
sys.exit(0 if rep and rep in out else 1)
PY

# a replica killed before closing its trace: the report still has all its events (its rings)
WR_DIE=1 "$run" -n 2 --mode trace --preload "$stub" --trace-dir "$work/traces2" -- "$replica" \
  >"$work/die.out" 2>"$work/die.err"
rc=$?
check "killed replica: 137 and named" test $rc -eq 137 -a "$(grep -c 'replica 1 (pid [0-9]*) was killed by signal 9' "$work/die.err")" -eq 1
check "killed replica: the report says its rings were recovered" grep -q '^ended .*cleanly .*died (rings recovered)' "$work/die.out"
check "killed replica: every event of both" grep -q '^events  *280  *280 *$' "$work/die.out"
"$wt" report --json "$work/traces2/replica-1.wlt" >"$work/die.json" 2>/dev/null
check "killed replica: JSON counts the recovered events" python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["processes"][0]
sys.exit(not (p["events"] == 280 and p["recovered_events"] > 0 and p["complete"] is False and p["truncated"] is False and p["iterations"] == 8))' "$work/die.json"

# a replica whose trace stayed empty is left out of the report, with a line
"$run" -n 2 --mode trace --preload "$stub" --trace-dir "$work/traces3" -- sh -c \
  'if [ $WAVELET_ROLE = 1 ]; then : >"$WAVELET_TRACE"; else exec "$0"; fi' "$replica" \
  >"$work/empty.out" 2>"$work/empty.err"
rc=$?
check "empty trace: exit 0, left out with a line" test $rc -eq 0 -a "$(grep -c "replica 1's trace .* is empty; left out of the report" "$work/empty.err")" -eq 1
check "empty trace: the report has the other" grep -q '^wavelet-trace report: 1 trace$' "$work/empty.out"

# 6. torchrun: the role from LOCAL_RANK, K from LOCAL_WORLD_SIZE, and CMD is exec'd
LOCAL_RANK=1 LOCAL_WORLD_SIZE=3 MASTER_PORT=29500 "$run" --mode off --trace-dir "$work/tr" -- \
  sh -c 'echo "$WAVELET_ROLE $WAVELET_WAVES $WAVELET_GROUP $WAVELET_TRACE $PPID"' >"$work/torch1.out" 2>/dev/null &
pid=$!
wait $pid
rc=$?
read -r role waves group trace ppid <"$work/torch1.out"
check "torchrun: exit 0, no prefix" test $rc -eq 0
check "torchrun: role 1 of 3, its trace path" test "$role $waves $trace" = "1 3 $work/tr/replica-1.wlt"
check "torchrun: CMD replaced wavelet-run (same process)" test "$ppid" = "$$"
LOCAL_RANK=0 LOCAL_WORLD_SIZE=3 MASTER_PORT=29500 "$run" -n 2 --mode off -- \
  sh -c 'echo "$WAVELET_ROLE $WAVELET_WAVES $WAVELET_GROUP"' >"$work/torch0.out" 2>/dev/null
check "torchrun: -n wins, ranks agree on the group" test "$(cat "$work/torch0.out")" = "0 2 $group"
LOCAL_RANK=5 LOCAL_WORLD_SIZE=2 "$run" --mode off -- true 2>"$work/torch.err"
rc=$?
check "torchrun: a rank past K is an error (2)" test $rc -eq 2
LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 "$run" --mode off -- sh -c 'exit 9' 2>/dev/null
check "torchrun: CMD's status" test $? -eq 9

# 7. bad arguments: the usage (two lines) and exit 2
badargs() { # badargs NAME ARGS...
  "$run" "${@:2}" >/dev/null 2>"$work/bad.err"
  local rc=$?
  if [[ $rc -eq 2 ]] && grep -q '^usage: wavelet-run -n K' "$work/bad.err" &&
    [[ $(wc -l <"$work/bad.err") -eq 3 ]]; then
    ok "bad arguments: $1 ($(head -1 "$work/bad.err"))"
  else
    no "bad arguments: $1: rc $rc: $(cat "$work/bad.err")"
  fi
}
badargs "nothing"
badargs "no -n" -- true
badargs "-n 0" -n 0 -- true
badargs "-n 65" -n 65 -- true
badargs "-n x" -n x -- true
badargs "-n without a value" -n
badargs "--mode" -n 2 --mode fast -- true
badargs "--mem-limit" -n 2 --mem-limit lots -- true
badargs "--group" -n 2 --group .hidden -- true
badargs "--gpu list" -n 2 --gpu 0,1 -- true
badargs "unknown option" -n 2 --frobnicate -- true
badargs "no command" -n 2 --
badargs "--trace-dir with a %" -n 2 --mode trace --trace-dir "$work/a%b" -- true
badargs "--groups with a bad name" --groups ../x
"$run" --groups --json ../x >"$work/badjson.out" 2>/dev/null
check "--groups --json with a bad name: nothing on stdout" test ! -s "$work/badjson.out"
"$run" --groups "wr-test-no-such-group-$$" >"$work/nogroup.out" 2>"$work/nogroup.err"
check "--groups with a group that is not there: exit 1, one line" \
  test $? -eq 1 -a "$(wc -l <"$work/nogroup.err")" -eq 1 -a ! -s "$work/nogroup.out"

# listing every group passes over a segment being made (or not ours), as --prune does
odd=/dev/shm/wavelet-wr-test-odd-$$
: >"$odd"
"$run" --groups >"$work/list.out" 2>"$work/list.err"
rc=$?
check "--groups: a segment being made is passed over, exit 0" test $rc -eq 0 -a ! -s "$work/list.err"
"$run" --groups "wr-test-odd-$$" >/dev/null 2>"$work/odd.err"
check "--groups NAME: the same segment named is an error" test $? -eq 1 -a -s "$work/odd.err"
rm -f "$odd"

# 8. no preload where the mode needs one: one clear line, exit 1
"$run" -n 2 --preload "$work/nowhere.so" -- true 2>"$work/nopre.err"
rc=$?
check "missing preload: exit 1 and one line naming it" test $rc -eq 1 -a "$(grep -c "mode 'gate' needs libwavelet.so.*nowhere.so: no such file" "$work/nopre.err")" -eq 1
mkdir -p "$work/prefix/bin" "$work/prefix/lib"
cp "$run" "$work/prefix/bin/" && cp "$stub" "$work/prefix/lib/libwavelet.so"
"$work/prefix/bin/wavelet-run" -n 1 -- sh -c 'echo "$LD_PRELOAD"' >"$work/next.out" 2>/dev/null
check "the preload next to the executable (../lib)" grep -qx "\[0\] $work/prefix/lib/libwavelet.so" "$work/next.out"
WAVELET_PRELOAD=$stub "$run" -n 1 -- sh -c 'echo "$LD_PRELOAD"' >"$work/envpre.out" 2>/dev/null
check "WAVELET_PRELOAD is used" grep -qx "\[0\] $(realpath "$stub")" "$work/envpre.out"

# 9. wavelet-trace record: trace mode, the file, the status, the default name
"$wt" record -o "$work/rec.wlt" --preload "$stub" -- sh -c \
  'echo "$WAVELET_MODE $WAVELET_TRACE $LD_PRELOAD $PYTORCH_CUDA_ALLOC_CONF"; exec "$0"' "$replica" \
  >"$work/rec.out" 2>"$work/rec.err"
rc=$?
check "record: exit 0" test $rc -eq 0
check "record: trace mode, the file, the preload" grep -qx "trace $work/rec.wlt $(realpath "$stub") backend:cudaMallocAsync" "$work/rec.out"
check "record: says it set the allocator" grep -q 'set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync' "$work/rec.err"
"$wt" report "$work/rec.wlt" >"$work/rec.rep" 2>&1
check "record: the trace reads back" grep -q '^iterations .* 8 (markers' "$work/rec.rep"
"$wt" record -o "$work/rec2.wlt" --preload "$stub" -- sh -c 'exit 5' 2>/dev/null
check "record: exit status passed through" test $? -eq 5
"$wt" record -o "$work/rec3.wlt" --preload "$stub" -- sh -c 'kill -9 $$' 2>/dev/null
check "record: a signal is 128+9" test $? -eq 137
mkdir -p "$work/ready3"
READY=$work/ready3 WAVELET_ROLE=0 "$wt" record -o "$work/rec4.wlt" --preload "$stub" -- \
  sh "$work/trap.sh" >"$work/rec4.out" 2>/dev/null &
pid=$!
wait_ready "$work/ready3" 1
kill -TERM $pid
wait $pid
rc=$?
check "record: SIGTERM forwarded, CMD's status 7" test $rc -eq 7 -a "$(cat "$work/rec4.out")" = "got TERM"
mkdir -p "$work/cwd"
(cd "$work/cwd" && "$wt" record --preload "$stub" "$replica" >/dev/null 2>&1)
check "record: the default file is CMD-PID.wlt" compgen -G "$work/cwd/$(basename "$replica")-*.wlt"
"$wt" record --preload "$stub" 2>"$work/rec.err"
check "record: no command is exit 2" test $? -eq 2
"$wt" record -o "$work/x.wlt" --preload "$work/nowhere.so" -- true 2>"$work/rec.err"
check "record: no preload is exit 1, one line" test $? -eq 1 -a "$(wc -l <"$work/rec.err")" -eq 1
# -o naming a directory, or with '%' (WAVELET_TRACE's %p would make it another file): one line,
# exit 2, and the command does not run
mkdir -p "$work/recdir"
for o in "$work/recdir" "$work/nodir/" "$work/x%p.wlt"; do
  "$wt" record -o "$o" --preload "$stub" -- sh -c ": >'$work/rec-ran'" 2>"$work/rec.err"
  rc=$?
  check "record: -o $o is exit 2, one line naming it" \
    test $rc -eq 2 -a "$(wc -l <"$work/rec.err")" -eq 1 -a -n "$(grep -F -- "$o" "$work/rec.err")"
  check "record: -o $o: the command did not run" test ! -e "$work/rec-ran"
done

# 10. under the real interposer, when the build has it
if [[ -n $real ]]; then
  "$run" -n 2 --mode trace --trace-dir "$work/real" -- sh -c 'echo "$LD_PRELOAD"' \
    >"$work/real.out" 2>"$work/real.err"
  rc=$?
  check "real preload: found next to wavelet-run" grep -qx "\[0\] $(realpath "$real")" "$work/real.out"
  check "real preload: exit 0, or no CUDA so no trace" \
    test $rc -eq 0 -o "$(grep -c 'no replica wrote a trace' "$work/real.err")" -eq 1
  "$wt" record -o "$work/real-rec.wlt" -- sh -c 'echo "$LD_PRELOAD $WAVELET_MODE"' \
    >"$work/real-rec.out" 2>/dev/null
  rc=$?
  check "real preload: record finds it, trace mode, status 0" \
    test $rc -eq 0 -a "$(cat "$work/real-rec.out")" = "$(realpath "$real") trace"
else
  echo "skip real preload: the build has no 'wavelet' target yet"
fi

finish test_run
