# A serve-app server with the 0-layer MiniLM, the poller beside it, then wrk: when does each
# HAProxy that Ray starts show in the tree, against its own create_time? From the repo root.
set -u
export PYTHONPATH=$PWD RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(python3 -c "import secrets;print(secrets.token_hex(32))")
export PATH=$PWD/.tools:$PATH LD_LIBRARY_PATH=$PWD/.tools
.venv/bin/python -c "import subprocess, time, psutil; t = time.time(); p = subprocess.Popen(['true']); print(f'psutil create_time - time.time() for a new process: {psutil.Process(p.pid).create_time() - t:+.3f} s'); p.wait()"
sed "s#/tmp/prof0/#benchmarks/results/profile/cpu_replica_x16_l0/#" benchmarks/results/profile/cpu_replica_x16_l0/l0.yaml > /tmp/l0.yaml
.venv/bin/serve-app run /tmp/l0.yaml > /tmp/poll_server.log 2>&1 &
srv=$!
.venv/bin/python benchmarks/results/throughput_runs/K_cpu_minilm_l0_pipeline/psutil_clock/poll.py $srv 60 &
for i in $(seq 180); do curl -sf http://127.0.0.1:8000/readyz >/dev/null 2>&1 && break; sleep 1; done
echo "$(date +%s.%N) ready after $i s"
sleep 3
echo "$(date +%s.%N) wrk start"
wrk -t1 -c32 -d8s -s benchmarks/results/profile/cpu_replica_x16_l0/post16.lua http://127.0.0.1:8000/v1/embeddings | grep Requests
kill -INT $srv; wait $srv; wait
