#!/usr/bin/env bash
# Install serve_app with its test extras into .venv, provide wrk, then lint, type-check and run
# the tests. This is the README's test command, and .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
# wrk (the throughput test requires it) installs beside pip's install, and is checked before
# any test runs: without it the run would fail at its end.
bash scripts/ensure_wrk.sh &
wrk_pid=$!
export SERVE_APP_REQUIRE_WRK=1
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# uv installs what pip would from the same pins, in about a quarter of the time (it unpacks and
# compiles bytecode in parallel). It does not read pip's configuration, so pip's find-links
# (where a machine may keep its CPU build of torch) are passed on.
.venv/bin/python -m pip install -qq --disable-pip-version-check uv==0.13.9
links=()
for dir in ${PIP_FIND_LINKS:-$(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true)}; do
  links+=(--find-links "$dir")
done
.venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode "${links[@]}" -e '.[test]'
wait "$wrk_pid"
# Ray with token auth and a fresh token per run, as serve-app runs it (docs/security.md).
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="${RAY_AUTH_TOKEN:-$(python3 -c "import secrets; print(secrets.token_hex(32))")}" RAY_USAGE_STATS_ENABLED=0
echo "== ruff"; .venv/bin/ruff check serve_app tests load_tests benchmarks research examples
PYTEST=(.venv/bin/python -m pytest -p no:cacheprovider)
# A pytest exit code as this script's: 5 (no tests collected) is a failure too.
pytest_code() {
  if [ "$1" -eq 5 ]; then echo "pytest collected no tests: that is a failure" >&2; echo 1; else echo "$1"; fi
}
if [ "$#" -gt 0 ]; then
  echo "== mypy"; .venv/bin/mypy serve_app
  echo "== pytest"
  set +e; "${PYTEST[@]}" --durations=25 "$@"; code=$?; set -e
  exit "$(pytest_code "$code")"
fi
# Two jobs side by side: mypy and the tests that need no Ray (CPU-bound) beside the Ray and GPU
# tests (mostly waiting on a local cluster), so that the 2-core CI machine keeps both cores
# busy. The first at the lowest priority: it takes only the CPU the second leaves idle, so the
# cluster's timing (scale-ups, health checks) is as it would be alone.
side=$(mktemp -d /tmp/serve_app_side.XXXXXX)
(
  set +e
  nice -n 19 .venv/bin/mypy serve_app > "$side/mypy.log" 2>&1; echo $? > "$side/mypy.rc"
  nice -n 19 "${PYTEST[@]}" --durations=10 tests/unit tests/load_tests tests/docs \
    > "$side/unit.log" 2>&1
  echo $? > "$side/unit.rc"
) &
side_pid=$!
echo "== pytest (mypy, then tests/unit tests/load_tests tests/docs, run beside it: their output follows)"
set +e
"${PYTEST[@]}" --durations=25 tests --ignore=tests/unit --ignore=tests/load_tests --ignore=tests/docs
ray_code=$?
wait "$side_pid"
set -e
mypy_code=$(cat "$side/mypy.rc" 2>/dev/null || echo 1)
unit_code=$(cat "$side/unit.rc" 2>/dev/null || echo 1)
echo "== mypy (ran beside the run above)"
cat "$side/mypy.log"
echo "== pytest tests/unit tests/load_tests tests/docs (ran beside the run above)"
cat "$side/unit.log"
rm -rf "$side"
status=0
[ "$mypy_code" -ne 0 ] && status=$mypy_code
for code in "$ray_code" "$unit_code"; do
  code=$(pytest_code "$code")
  [ "$code" -ne 0 ] && status=$code
done
echo "exit codes: mypy $mypy_code, Ray and GPU tests $ray_code, the others $unit_code"
exit "$status"
