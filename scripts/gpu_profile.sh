#!/usr/bin/env bash
# On the GPU host: where does serve_app's time go with small requests? Three short runs of
# load_tests.side_by_side restricted to serve_app, one after another on GPU 0, all with a 1 ms
# batch wait: 1 replica x 1.0 GPU; 4 x 0.25 time-sliced; 4 x 0.25 under MPS.
set -u
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
OUT="${OUT:-/tmp/gpu-out}"; RES=/tmp/profile; mkdir -p "$OUT" "$RES"
W1='{"batch_wait_timeout_s": 0.001}'
run() {  # name replicas args
  timeout 170 python3 -m load_tests.side_by_side --only serve_app --max-time-s 150 \
    --replicas "$2" --serve-app-args "$3" --out "$RES/$1" > "$RES/$1.log" 2>&1
  echo "$1 exit $?" >> "$RES/$1.log"
}
run r1_w1 1 "$W1"
run r4_w1 4 "$W1"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps0 CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog0
mkdir -p /tmp/mps0 /tmp/mpslog0
nvidia-cuda-mps-control -d && echo "MPS daemon up"
run r4_w1_mps 4 "$W1"
echo quit | nvidia-cuda-mps-control
for f in "$RES"/*.log; do echo "== $f"; grep -E "offered|exit|rror" "$f" | grep -v "INFO" | tail -10; done
tar -czf "$OUT/profile.tgz" -C "$RES" .
