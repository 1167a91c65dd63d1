#!/usr/bin/env bash
# wavelet-bench's launcher and signals: SIGTERM to it stops its replicas, reaps them, removes the
# group's segment and reports (exit 143); SIGKILL to it, which it cannot forward, still ends the
# replicas (PR_SET_PDEATHSIG) rather than leave them training.
# Usage: bench_wavelet_signals.sh WAVELET_BENCH WORK_DIR
# shellcheck disable=SC2317 # the helpers run through check and wait_for
set -uo pipefail
bench=$1 work=$2
rm -rf "$work"
mkdir -p "$work"
# shellcheck source=tests/run/lib.sh
. "$(dirname "$0")/../run/lib.sh"
run=(--backend cpu --model mlp --data synthetic --train-samples 2000 --test-samples 100
  --threads 1 --mode ticktock --replicas 2 --steps 100000000 --quiet --json)

# children PID: its child processes, from every process's PPid (gVisor's runsc, where make
# test-gvisor runs this, has no /proc/PID/task/TID/children)
children() {
  local f
  for f in $(grep -l "^PPid:[[:space:]]*$1\$" /proc/[0-9]*/status 2>/dev/null); do
    f=${f#/proc/}
    echo "${f%/status}"
  done
}
two_children() { [[ $(children "$1" | wc -w) -eq 2 ]]; }
group_exists() { compgen -G "/dev/shm/wavelet-wavelet-bench-$1*" >/dev/null; }
started() { two_children "$p" && group_exists "$p"; } # of the launcher $p
no_group() { ! group_exists "$p"; }
# gone PID...: none of them runs any more (a zombie left for init to reap counts as gone)
gone() {
  local k st
  for k in "$@"; do
    st=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' /proc/"$k"/status 2>/dev/null)
    [[ -z $st || $st == Z ]] || return 1
  done
}

# Whatever a failed check left running is killed at the end (by pid: these are ours).
left=()
trap 'for k in "${left[@]}"; do kill -KILL "$k" 2>/dev/null; done' EXIT

# 1. SIGTERM to the launcher once both replicas are in the group and training.
"$bench" "${run[@]}" >"$work/term.out" 2>"$work/term.err" &
p=$!
check "SIGTERM: the replicas start and join the group" wait_for 400 started
read -ra kids <<<"$(children "$p" | tr '\n' ' ')"
left+=("${kids[@]}")
kill -TERM "$p"
wait "$p"
rc=$?
check "SIGTERM: exit 143 (got $rc)" test $rc -eq 143
check "SIGTERM: the replicas are gone (${kids[*]})" gone "${kids[@]}"
check "SIGTERM: the group's segment is removed" no_group
check "SIGTERM: the launcher says so" grep -q '^wavelet-bench: Terminated: stopping the replicas' "$work/term.err"
check "SIGTERM: each replica killed by it" test "$(grep -c 'killed by signal 15' "$work/term.err")" -ge 2
check "SIGTERM: the table" grep -q '^stopped by signal 15' "$work/term.err"
check "SIGTERM: the JSON" grep -q '"stopped_by_signal":15,' "$work/term.out"
rm -f /dev/shm/wavelet-wavelet-bench-"$p"*

# 2. SIGKILL to the launcher: the replicas end anyway; the segment is left (nobody to remove it).
"$bench" "${run[@]}" >"$work/kill.out" 2>"$work/kill.err" &
p=$!
check "SIGKILL: the replicas start" wait_for 400 started
read -ra kids <<<"$(children "$p" | tr '\n' ' ')"
left+=("${kids[@]}")
kill -KILL "$p"
wait "$p" 2>/dev/null
check "SIGKILL: the replicas end with the launcher (${kids[*]})" wait_for 400 gone "${kids[@]}"
rm -f /dev/shm/wavelet-wavelet-bench-"$p"*
finish bench_wavelet_signals
