# shellcheck shell=bash
# Shell helpers shared by tests/run's scripts (sourced): counted checks, a bounded wait, the end.
fail=0
ok() { echo "ok   $1"; }
no() {
  echo "FAIL $1"
  fail=$((fail + 1))
}
check() { # check NAME COMMAND...
  if "${@:2}"; then ok "$1"; else no "$1"; fi
}
wait_for() { # wait_for TRIES COMMAND...: COMMAND every 50 ms until it succeeds, at most TRIES times
  local n=$1
  shift
  for _ in $(seq "$n"); do
    "$@" && return 0
    sleep 0.05
  done
  return 1
}
finish() { # finish NAME: exit 1 when a check failed, else 0
  if [[ $fail -ne 0 ]]; then
    echo "$1: $fail checks failed"
    exit 1
  fi
  echo "$1: all checks passed"
  exit 0
}
