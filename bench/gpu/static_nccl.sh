#!/usr/bin/env bash
# static_nccl.sh BIN PRELOAD DIR: a kernel named as NCCL's (NCCL linked in statically, no entry
# point marks it) is never gated. A holder replica takes the gate's token and keeps it at its
# peak; a second replica launches its "all-reduce" as its iteration begins. That launch must go
# through while the holder still holds the token (were it gated, it would wait for the holder),
# and the same replica's first allocation must then wait (the gate works at all). The stats'
# "gate skipped in NCCL" count is printed, not required: whether the launch reaches the gate's
# slow path at all depends on what ran before it.
# Exit 0 when both hold; else 1 with one line saying which did not.
set -u
BIN=$1 PRELOAD=$2 DIR=$3
HOLD_MS=${WAVELET_NCCL_HOLD_MS:-8000}
mkdir -p "$DIR"
G=wl-gpucheck-nccl-$$
H=$DIR/nccl_holder.out R=$DIR/nccl_replica.out
hp= rp=
cleanup() {
  [ -n "$hp" ] && kill "$hp" 2>/dev/null
  [ -n "$rp" ] && kill "$rp" 2>/dev/null
  wait 2>/dev/null
  rm -f "/dev/shm/wavelet-$G" # both replicas are gone: nothing else uses the group
}
trap cleanup EXIT
# until FILE PATTERN TENTHS: 0 once FILE has a line matching PATTERN, within TENTHS x 0.1 s.
until_line() {
  local i
  for ((i = 0; i < $3; i++)); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  grep -q "$2" "$1" 2>/dev/null
}
# One line, then what shows why: the group as wavelet-run sees it now, and both replicas' output
# with their stats (the holder's once its hold is over).
fail() {
  echo "static_nccl: $*"
  "$BIN/wavelet-run" --groups "$G" 2>&1
  local i
  for ((i = 0; i < HOLD_MS / 100 + 50; i++)); do
    [ -z "$hp" ] || ! kill -0 "$hp" 2>/dev/null && break
    sleep 0.1
  done
  echo "--- holder"; cat "$H"; echo "--- replica"; cat "$R"
  exit 1
}

env LD_PRELOAD="$PRELOAD" WAVELET_MODE=gate WAVELET_GROUP="$G" WAVELET_GATE_TIMEOUT_MS=0 \
  WAVELET_SHOW_STATS=1 "$BIN/wl-prog-replica" --iters 1 --markers --hold-ms "$HOLD_MS" >"$H" 2>&1 &
hp=$!
until_line "$H" 'iter 0 peak' 300 || fail "the holder never reached its peak"
t0=$(date +%s%N)
env LD_PRELOAD="$PRELOAD" WAVELET_MODE=gate WAVELET_GROUP="$G" WAVELET_GATE_TIMEOUT_MS=0 \
  WAVELET_SHOW_STATS=1 "$BIN/wl-prog-replica" --iters 2 --markers --collective >"$R" 2>&1 &
rp=$!
# Within the hold, less three seconds for what follows while it holds.
until_line "$R" 'collective-launch done' $((HOLD_MS / 100 - 30)) ||
  fail "the NCCL-named launch did not go through while another replica held the token"
grep -q 'iter 0 done' "$H" &&
  fail "the holder had released before the NCCL-named launch went through: nothing shown"
t1=$(date +%s%N)
# The gate works at all: a second on, the replica waits at the gate, short of its peak, while the
# holder still holds (its hold has seconds to go).
until_line "$R" 'iter 0 peak' 10 &&
  fail "the replica reached its peak while the holder held the token: the gate did not work"
"$BIN/wavelet-run" --groups "$G" 2>&1 | grep -q 'waits at the gate' ||
  fail "the replica is not seen waiting at the gate (wavelet-run --groups)"
grep -q 'iter 0 done' "$H" &&
  fail "the holder had released before the replica was seen waiting: nothing shown"
wait "$hp" || fail "the holder failed"
hp=
wait "$rp" || fail "the replica failed"
rp=
grep -q 'iter 1 done' "$R" || fail "the replica did not finish its iterations"
skipped=$(awk '/gate skipped in NCCL/ { n = $NF } END { print n + 0 }' "$R")
echo "static_nccl: the NCCL-named launch went through $(((t1 - t0) / 1000000)) ms after the" \
  "replica started, while the holder held the token; gate skipped in NCCL: $skipped"
