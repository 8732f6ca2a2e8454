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
# The modules that start a Ray of their own (serve-app run, the tools' dry runs, two nodes)
# each mostly wait on one process starting up (Ray, a replica importing torch): after the rest,
# they run as two pytest processes side by side, which keeps both cores busy. A module not named
# here runs in the first run, after the shared cluster's (tests/integration/conftest.py).
OWN_RAY_A=(tests/integration/test_throughput.py tests/integration/test_cli_run.py
  tests/integration/test_node_cli.py)
OWN_RAY_B=(tests/integration/test_planproof.py tests/integration/test_plan_measure.py
  tests/integration/test_custom_model.py tests/integration/test_two_nodes.py)
ignored=(--ignore=tests/unit --ignore=tests/load_tests --ignore=tests/docs)
for path in "${OWN_RAY_A[@]}" "${OWN_RAY_B[@]}"; do ignored+=("--ignore=$path"); done
# Mypy and the tests that need no Ray (CPU-bound) run beside the shared cluster's tests, at the
# lowest priority: they take only the CPU the cluster leaves idle, so its timing (scale-ups,
# health checks) is as it would be alone.
logs=$(mktemp -d /tmp/serve_app_side.XXXXXX)
(
  set +e
  nice -n 19 .venv/bin/mypy serve_app > "$logs/mypy.log" 2>&1; echo $? > "$logs/mypy.rc"
  nice -n 19 "${PYTEST[@]}" --durations=10 tests/unit tests/load_tests tests/docs \
    > "$logs/unit.log" 2>&1
  echo $? > "$logs/unit.rc"
) &
side_pid=$!
echo "== pytest: the shared cluster's and the GPU tests (mypy, tests/unit, tests/load_tests and"
echo "   tests/docs run beside it, then the own-Ray modules in two runs: their output follows)"
set +e
"${PYTEST[@]}" --durations=25 tests "${ignored[@]}"
ray_code=$?
"${PYTEST[@]}" --durations=10 "${OWN_RAY_B[@]}" > "$logs/own_b.log" 2>&1 &
own_b_pid=$!
"${PYTEST[@]}" --durations=10 "${OWN_RAY_A[@]}" > "$logs/own_a.log" 2>&1
own_a_code=$?
wait "$own_b_pid"
own_b_code=$?
wait "$side_pid"
set -e
mypy_code=$(cat "$logs/mypy.rc" 2>/dev/null || echo 1)
unit_code=$(cat "$logs/unit.rc" 2>/dev/null || echo 1)
echo "== pytest ${OWN_RAY_A[*]} (ran beside the next)"
cat "$logs/own_a.log"
echo "== pytest ${OWN_RAY_B[*]} (ran beside the one above)"
cat "$logs/own_b.log"
echo "== mypy (ran beside the first run)"
cat "$logs/mypy.log"
echo "== pytest tests/unit tests/load_tests tests/docs (ran beside the first run)"
cat "$logs/unit.log"
rm -rf "$logs"
status=0
[ "$mypy_code" -ne 0 ] && status=$mypy_code
for code in "$ray_code" "$own_a_code" "$own_b_code" "$unit_code"; do
  code=$(pytest_code "$code")
  [ "$code" -ne 0 ] && status=$code
done
echo "exit codes: mypy $mypy_code, shared cluster and GPU tests $ray_code, own-Ray A $own_a_code, own-Ray B $own_b_code, the others $unit_code"
exit "$status"
