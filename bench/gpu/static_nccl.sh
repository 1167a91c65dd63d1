#!/usr/bin/env bash
# static_nccl.sh BIN PRELOAD DIR: a kernel named as NCCL's (NCCL linked in statically, no entry
# point marks it) is never gated. A holder replica takes the gate's token and keeps it at its
# peak until this script lets it go; a second replica launches its "all-reduce" as its iteration
# begins. That launch must go through while the holder holds the token (were it gated, it would
# wait for the holder), and the same replica's first allocation must then wait (the gate works at
# all). The stats' "gate skipped in NCCL" count is printed, not required: whether the launch
# reaches the gate's slow path at all depends on what ran before it.
# WAVELET_NCCL_HOLD_MS (default 8000): how long the NCCL-named launch, and then the replica's
# wait at the gate, may take to be seen (counted in polls of 0.1 s, so a loaded machine gets more).
# Exit 0 when both hold; else 1 with one line saying which did not.
set -u
BIN=$1 PRELOAD=$2 DIR=$3
HOLD_MS=${WAVELET_NCCL_HOLD_MS:-8000}
mkdir -p "$DIR"
G=wl-gpucheck-nccl-$$
H=$DIR/nccl_holder.out R=$DIR/nccl_replica.out
# The holder holds its peak until this file exists: no time at which its hold ends on its own,
# so nothing below depends on how fast a loaded machine runs this script.
GO=$DIR/nccl_release.$$
hp='' rp=''
cleanup() {
  : >"$GO" 2>/dev/null # a holder still at its peak goes on, and exits
  [ -n "$hp" ] && kill "$hp" 2>/dev/null
  [ -n "$rp" ] && kill "$rp" 2>/dev/null
  wait 2>/dev/null
  rm -f "/dev/shm/wavelet-$G" "$GO" # both replicas are gone: nothing else uses the group
}
trap cleanup EXIT
rm -f "$GO"
# Emptied here, not only by the redirections below: those run in the background children, which
# a loaded machine may start after the first look, and a previous run's lines ('iter 0 peak',
# 'collective-launch done') would then be read as this run's.
: >"$H" && : >"$R" || exit 1
# until_line FILE PATTERN TENTHS: 0 once FILE has a line matching PATTERN, within TENTHS polls.
until_line() {
  local i
  for ((i = 0; i < $3; i++)); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  grep -q "$2" "$1" 2>/dev/null
}
# 0 when wavelet-run --groups shows the holder holding the token and the replica waiting at the
# gate, now.
seen_waiting() {
  "$BIN/wavelet-run" --groups "$G" 2>/dev/null | awk -v h="$hp" -v r="$rp" '
    $2 == h && /holds the token/ { held = 1 }
    $2 == r && /waits at the gate/ { waits = 1 }
    END { exit !(held && waits) }'
}
# One line, then what shows why: the group as wavelet-run sees it now, and both replicas' output
# with their stats (the holder's once it has been let go and has exited).
fail() {
  echo "static_nccl: $*"
  "$BIN/wavelet-run" --groups "$G" 2>&1
  # A holder at its peak that runs yet is not in the group kept the token in a segment another
  # process removed (a concurrent bench/gpu-check.sh's clean-up did): not the gate's doing.
  if [ -n "$hp" ] && kill -0 "$hp" 2>/dev/null && grep -q 'iter 0 peak' "$H" &&
    ! "$BIN/wavelet-run" --groups "$G" 2>/dev/null | awk -v h="$hp" '$2 == h { f = 1 } END { exit !f }'; then
    echo "static_nccl: the holder (pid $hp) runs but is not in group $G: its segment was removed" \
      "under it by another process"
  fi
  : >"$GO"
  local i
  for ((i = 0; i < 100; i++)); do
    [ -z "$hp" ] || ! kill -0 "$hp" 2>/dev/null && break
    sleep 0.1
  done
  echo "--- holder"; cat "$H"; echo "--- replica"; cat "$R"
  exit 1
}

env LD_PRELOAD="$PRELOAD" WAVELET_MODE=gate WAVELET_GROUP="$G" WAVELET_GATE_TIMEOUT_MS=0 \
  WAVELET_SHOW_STATS=1 "$BIN/wl-prog-replica" --iters 1 --markers --wait-file "$GO" >"$H" 2>&1 &
hp=$!
until_line "$H" 'iter 0 peak' 300 || fail "the holder never reached its peak"
t0=$(date +%s%N)
env LD_PRELOAD="$PRELOAD" WAVELET_MODE=gate WAVELET_GROUP="$G" WAVELET_GATE_TIMEOUT_MS=0 \
  WAVELET_SHOW_STATS=1 "$BIN/wl-prog-replica" --iters 2 --markers --collective >"$R" 2>&1 &
rp=$!
until_line "$R" 'collective-launch done' $((HOLD_MS / 100)) ||
  fail "the NCCL-named launch did not go through while another replica held the token"
t1=$(date +%s%N)
# The gate works at all: the replica is seen waiting at the gate while the holder holds, and a
# second later it still waits, short of its peak.
for ((i = 0; i < HOLD_MS / 100; i++)); do
  grep -q 'iter 0 peak' "$R" &&
    fail "the replica reached its peak while the holder held the token: the gate did not work"
  seen_waiting && break
  sleep 0.1
done
seen_waiting || fail "the replica is not seen waiting at the gate (wavelet-run --groups)"
until_line "$R" 'iter 0 peak' 10 &&
  fail "the replica reached its peak while the holder held the token: the gate did not work"
seen_waiting || fail "the replica did not go on waiting at the gate (wavelet-run --groups)"
: >"$GO"
wait "$hp" || fail "the holder failed"
hp=
wait "$rp" || fail "the replica failed"
rp=
grep -q 'iter 1 done' "$R" || fail "the replica did not finish its iterations"
skipped=$(awk '/gate skipped in NCCL/ { n = $NF } END { print n + 0 }' "$R")
echo "static_nccl: the NCCL-named launch went through $(((t1 - t0) / 1000000)) ms after the" \
  "replica started, while the holder held the token; gate skipped in NCCL: $skipped"
