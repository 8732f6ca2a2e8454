#!/usr/bin/env bash
# Run Debian's Prometheus (`apt install prometheus`; not installed by this script) against a local
# serve_app server, then ask it, through its HTTP API, every query of the Grafana dashboard
# (deploy/grafana/serve_app.json) and print whether each returns data.
#
# Usage: serve-app run configs/X.yaml   (in another shell; it prints the metrics port)
#        bash scripts/prometheus_local.sh
# Environment:
#   PROMETHEUS_BIN          the prometheus binary (default: /usr/bin/prometheus, Debian's path)
#   SERVE_APP_METRICS_PORT  Ray's metrics port that serve-app run pinned (default 8080)
#   PROMETHEUS_PORT         where this Prometheus listens, on 127.0.0.1 (default 9091, beside
#                           a system Prometheus on 9090)
#   SERVE_URL               when set, e.g. http://127.0.0.1:8000/v1/embeddings, the script POSTs
#                           a few requests there (JSON of REQUEST_BODY) so the request panels
#                           have data; without it, send your own load meanwhile
#   SERVE_APP_API_KEY       a bearer key for SERVE_URL, when the server has keys
#   WAIT_S                  seconds of scraping before the queries (default 40: two rate windows
#                           of 5 s scrapes, and Ray's export delay)
# Exit status: 0 when every query returned data, 1 otherwise (some panels need events a quiet
# CPU server never has: budget escapes, OOM splits, 503s and 504s; they print "no data").
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PROMETHEUS_BIN=${PROMETHEUS_BIN:-/usr/bin/prometheus}
METRICS_PORT=${SERVE_APP_METRICS_PORT:-8080}
PROM_PORT=${PROMETHEUS_PORT:-9091}
WAIT_S=${WAIT_S:-40}
REQUEST_BODY=${REQUEST_BODY:-'{"input": ["a short sentence to embed", "and another"]}'}
PYTHON=${PYTHON:-python3}

if [ ! -x "$PROMETHEUS_BIN" ]; then
    echo "error: no Prometheus at $PROMETHEUS_BIN; apt install prometheus, or set PROMETHEUS_BIN" >&2
    exit 2
fi
if ! curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" -o /dev/null; then
    echo "error: nothing answers at http://127.0.0.1:$METRICS_PORT/metrics; start serve-app run" \
        "first (or set SERVE_APP_METRICS_PORT to the port it printed)" >&2
    exit 2
fi

WORK=$(mktemp -d)
sed "s/127.0.0.1:8080/127.0.0.1:$METRICS_PORT/" "$ROOT/deploy/prometheus/prometheus.yml" \
    >"$WORK/prometheus.yml"
"$PROMETHEUS_BIN" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/data" \
    --web.listen-address="127.0.0.1:$PROM_PORT" >"$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
cleanup() {
    kill "$PROM_PID" 2>/dev/null
    wait "$PROM_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
echo "Prometheus (pid $PROM_PID) on http://127.0.0.1:$PROM_PORT scraping 127.0.0.1:$METRICS_PORT;" \
    "querying in ${WAIT_S} s"

END=$(($(date +%s) + WAIT_S))
while [ "$(date +%s)" -lt "$END" ]; do
    if ! kill -0 "$PROM_PID" 2>/dev/null; then
        echo "error: Prometheus exited; its log:" >&2
        cat "$WORK/prometheus.log" >&2
        exit 2
    fi
    if [ -n "${SERVE_URL:-}" ]; then
        for _ in 1 2 3 4 5; do
            curl -s -o /dev/null -H 'content-type: application/json' \
                ${SERVE_APP_API_KEY:+-H "authorization: Bearer $SERVE_APP_API_KEY"} \
                -d "$REQUEST_BODY" "$SERVE_URL"
        done
    fi
    sleep 1
done

"$PYTHON" - "$ROOT/deploy/grafana/serve_app.json" "http://127.0.0.1:$PROM_PORT" <<'PY'
import json, sys, urllib.parse, urllib.request

dashboard, prom = sys.argv[1], sys.argv[2]
# Grafana's variables, as Grafana would fill them in for "All" over the last minute.
subs = {"$__rate_interval": "1m", "$application": ".*"}
missing = 0
for panel in json.load(open(dashboard))["panels"]:
    print(f"{panel['title']}")
    for target in panel["targets"]:
        expr = target["expr"]
        for var, value in subs.items():
            expr = expr.replace(var, value)
        url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                answer = json.load(resp)
        except Exception as exc:  # an HTTP 400 carries PromQL's own error
            body = getattr(exc, "read", lambda: b"")().decode(errors="replace")
            print(f"  ERROR    {target['legendFormat']}: {exc} {body[:200]}")
            missing += 1
            continue
        series = answer.get("data", {}).get("result", [])
        state = "data" if series else "no data"
        missing += not series
        print(f"  {state:8} {target['legendFormat']} ({len(series)} series)")
print(f"{missing} quer{'y' if missing == 1 else 'ies'} without data")
sys.exit(1 if missing else 0)
PY
