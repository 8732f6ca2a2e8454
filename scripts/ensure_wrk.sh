#!/usr/bin/env bash
# wrk, the closed-loop client behind every req/s figure in the docs, for the throughput test
# (tests/integration/test_throughput.py), which scripts/test.sh makes require it. Already there
# (.tools/wrk or on PATH): nothing to do. Missing on a machine with apt-get, as root (CI):
# Debian's `wrk` package. Otherwise: stop, saying how to get it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .tools/wrk ] || command -v wrk > /dev/null 2>&1; then
  exit 0
fi
if command -v apt-get > /dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
  echo "== wrk: installing Debian's package (apt-get install wrk)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq > /dev/null
  apt-get install -y -qq --no-install-recommends wrk > /dev/null
  if command -v wrk > /dev/null 2>&1; then
    exit 0
  fi
fi
cat >&2 << 'MSG'
wrk is missing, and the tests need it: the throughput test runs it, as every req/s figure in
the docs was measured with it. Install it and run again:
  Debian/Ubuntu: sudo apt-get install wrk
  macOS:         brew install wrk
  elsewhere:     build https://github.com/wg/wrk and put the binary on PATH or at .tools/wrk
(as root on a machine with apt-get, scripts/test.sh installs it by itself).
MSG
exit 1
