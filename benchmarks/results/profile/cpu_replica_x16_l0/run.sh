set -u
cd /work/main
export PYTHONPATH=$PWD RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(python3 -c "import secrets;print(secrets.token_hex(32))")
export PATH=$PWD/.tools:$PATH LD_LIBRARY_PATH=$PWD/.tools
.venv/bin/serve-app run /tmp/prof0/l0.yaml > /tmp/prof0/server.log 2>&1 &
srv=$!
for i in $(seq 180); do curl -sf http://127.0.0.1:8000/readyz >/dev/null 2>&1 && break; sleep 1; done
echo "ready after $i s"
curl -s -XPOST localhost:8000/v1/embeddings -H 'content-type: application/json' -d @/tmp/prof0/body16.json | head -c 120; echo
wrk -t1 -c32 -d6s -s /tmp/prof0/post16.lua http://127.0.0.1:8000/v1/embeddings > /tmp/prof0/wrk_warm.txt
pid=$(pgrep -f 'ServeReplica:embeddings:model' | head -1)
echo "replica $pid"
wrk -t1 -c32 -d25s -s /tmp/prof0/post16.lua http://127.0.0.1:8000/v1/embeddings > /tmp/prof0/wrk.txt &
sleep 3
t0=$(awk '{print $14+$15}' /proc/$pid/stat)
.venv/bin/py-spy record -p $pid -d 15 -r 200 -f raw --threads --nonblocking -o /tmp/prof0/replica.raw > /tmp/prof0/pyspy.log 2>&1
t1=$(awk '{print $14+$15}' /proc/$pid/stat)
echo "replica cpu ticks over 15 s: $((t1-t0))"
wait %2 2>/dev/null; sleep 8
cat /tmp/prof0/wrk.txt
kill -INT $srv; wait $srv
echo done
