#!/usr/bin/env bash
# Install serve_app with its test extras into .venv, provide wrk, then lint, type-check and run
# the tests. This is the README's test command, and .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
# wrk first: without it the run would fail at its end (the throughput test requires it).
bash scripts/ensure_wrk.sh
export SERVE_APP_REQUIRE_WRK=1
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -qq --disable-pip-version-check -e '.[test]'
# Ray with token auth and a fresh token per run, as serve-app runs it (docs/security.md).
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="${RAY_AUTH_TOKEN:-$(python3 -c "import secrets; print(secrets.token_hex(32))")}" RAY_USAGE_STATS_ENABLED=0
echo "== ruff"; .venv/bin/ruff check serve_app tests load_tests benchmarks research examples
echo "== mypy"; .venv/bin/mypy serve_app
echo "== pytest"
if [ "$#" -gt 0 ]; then  # tests named on the command line: one pytest, as given
  set +e
  .venv/bin/python -m pytest -p no:cacheprovider --durations=25 "$@"
  code=$?
  set -e
  if [ "$code" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure" >&2
    exit 1
  fi
  exit "$code"
fi
# The whole suite as two pytest runs side by side (CI has 2 cores, and the integration tests
# wait on Ray more than they compute): the tests on the session's Ray cluster (marked
# ray_session by tests/conftest.py) in one, in file order as alone; the unit tests and the
# commands that start a Ray of their own in the other. Then the kill-and-hang tests (marked
# alone) by themselves, on a session cluster of their own. Each has its own short basetemp
# (HAProxy's socket paths must stay under 98 bytes). The logs are printed whole, in turn.
work=$(mktemp -d /tmp/sa-ci-XXXXXX)
run() {  # name, marker expression: one pytest into $work/name.log
  .venv/bin/python -m pytest -p no:cacheprovider --durations=15 --basetemp "$work/$1" \
    -m "$2" > "$work/$1.log" 2>&1
}
set +e
run session "ray_session and not alone" &
session_pid=$!
run rest "not ray_session and not alone" &
rest_pid=$!
wait "$session_pid"; session_code=$?
wait "$rest_pid"; rest_code=$?
run alone "alone"; alone_code=$?
set -e
echo "== pytest: the tests on the session's Ray cluster (exit $session_code)"; cat "$work/session.log"
echo "== pytest: the rest (exit $rest_code)"; cat "$work/rest.log"
echo "== pytest: the kill-and-hang tests, alone (exit $alone_code)"; cat "$work/alone.log"
rm -rf "$work"
for code in "$session_code" "$rest_code" "$alone_code"; do
  if [ "$code" -eq 5 ]; then
    echo "a pytest run collected no tests: that is a failure" >&2
    exit 1
  fi
done
[ "$session_code" -eq 0 ] && [ "$rest_code" -eq 0 ] && [ "$alone_code" -eq 0 ]
