#!/usr/bin/env bash
# The whole test suite inside a gVisor sandbox (runsc), as the lent GPU machines have run: their
# kernel refuses OFD locks, takes ~10 ms a membarrier and hides sysfs's CPU topology, and we
# depend on all three (libsched, the trace's rings file, liballoc's thread caches, affinity).
# The _gvisor ctest variants emulate the first two on every machine, in CI; this runs the real
# thing. Not in CI: it needs root, ptrace and about 4 minutes on 2 cores.
#   scripts/gvisor-check.sh [BUILD]      # after make build; installs Debian's runsc if missing
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
[ -d "$B" ] || { echo "gvisor-check: $B not found: run make build first" >&2; exit 2; }
if ! command -v runsc >/dev/null; then
  [ "$(id -u)" -eq 0 ] || { echo "gvisor-check: runsc is missing and needs root to install" >&2; exit 2; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runsc >/dev/null
fi
if ! runsc --platform=ptrace --network=none do true 2>/dev/null; then
  echo "gvisor-check: runsc cannot start a sandbox here (root and ptrace are needed)" >&2
  exit 77
fi
echo "gvisor-check: $(runsc --version | head -1); kernel inside: $(runsc --platform=ptrace --network=none do uname -r)"
cd "$B"
# The GPU test is skipped there as here; one ctest run inside one sandbox.
exec runsc --platform=ptrace --network=none do ctest -j "$(nproc)" --timeout 400 --output-on-failure
