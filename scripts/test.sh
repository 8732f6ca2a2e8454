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
set +e
.venv/bin/python -m pytest -p no:cacheprovider --durations=25 "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$code"
