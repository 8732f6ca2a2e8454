#!/usr/bin/env bash
# On the two-GPU host: where does serve_app's time go with small requests? Four runs of
# load_tests.side_by_side restricted to serve_app, two per GPU, in parallel:
#   GPU 0: 1 replica x 1.0 GPU, then 4 x 0.25 (both with a 1 ms batch wait, time-sliced)
#   GPU 1: 4 x 0.25 under MPS, with a 1 ms batch wait, then with the default 5 ms wait
set -u
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu-out}"; RES=/tmp/profile; mkdir -p "$OUT" "$RES"
W1='{"batch_wait_timeout_s": 0.001}'
run() {  # name replicas args
  timeout 250 python3 -m load_tests.side_by_side --only serve_app --max-time-s 200 \
    --replicas "$2" --serve-app-args "$3" --out "$RES/$1" > "$RES/$1.log" 2>&1
  echo "$1 exit $?" >> "$RES/$1.log"
}
(
  export CUDA_VISIBLE_DEVICES=0
  run r1_w1 1 "$W1"
  run r4_w1 4 "$W1"
) &
(
  export CUDA_VISIBLE_DEVICES=1 CUDA_MPS_PIPE_DIRECTORY=/tmp/mps1 CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog1
  mkdir -p /tmp/mps1 /tmp/mpslog1
  nvidia-cuda-mps-control -d && echo "MPS daemon up on GPU 1"
  run r4_w1_mps 4 "$W1"
  run r4_w5_mps 4 '{}'
  echo quit | nvidia-cuda-mps-control
) &
wait
for f in "$RES"/*.log; do echo "== $f"; grep -E "offered|exit|error|Error" "$f" | grep -v "INFO" | tail -12; done
tar -czf "$OUT/profile.tgz" -C "$RES" .
