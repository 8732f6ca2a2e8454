set -u
cd /work/main
export PYTHONPATH=$PWD RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(python3 -c "import secrets;print(secrets.token_hex(32))")
export PATH=$PWD/.tools:$PATH LD_LIBRARY_PATH=$PWD/.tools
.venv/bin/serve-app run /tmp/prof0/l0.yaml > /tmp/prof0/server2.log 2>&1 &
srv=$!
.venv/bin/python /tmp/prof0/poll.py $srv 100 > /tmp/prof0/poll.txt 2>&1 &
for i in $(seq 180); do curl -sf http://127.0.0.1:8000/readyz >/dev/null 2>&1 && break; sleep 1; done
echo "$(date +%s.%N) ready after $i s"
sleep 5
echo "$(date +%s.%N) wrk start"
wrk -t1 -c32 -d10s -s /tmp/prof0/post16.lua http://127.0.0.1:8000/v1/embeddings | grep Requests
echo "$(date +%s.%N) wrk end"
sleep 3
kill -INT $srv; wait $srv
sleep 1; cat /tmp/prof0/poll.txt
