"""Start-up bench, one command: how soon a replica serves (issue #11).

    python -m load_tests.benchmarks.startup --device cuda --out startup.json --repeats 5 \
        --budget-s 420
    python -m load_tests.benchmarks.startup --device cpu --quick --out dry.json  # 3 min, 2 cores

Three parts, in this order, each given a share of ``--budget-s`` (what one leaves goes to the
next); a part with too little left skips its remaining repeats and says so in
``summary.skipped``. The JSON at ``--out`` (meta, rows, summary) is rewritten after every row.

``cold`` (rows ``cold_4x0.25_minilm``; on a CPU ``cold_2xcpu_minilm``): ``python -m serve_app
run CONFIG`` in a subprocess, as a user runs it. CONFIG: configs/gpu-shared.yaml (4 MiniLM
replicas at num_gpus 0.25, float16) with ``load_format: dummy`` (the GPU host has no weights);
on a CPU, configs/cpu.yaml with 2 replicas at num_cpus 0.5 and the real weights. Clocks
(time.monotonic), all from just before the subprocess is spawned:

- ``cold_ready_s``: to the first ``GET /readyz`` answered 200 (polled every 0.1 s);
- ``all_serving_s``: to the end of the first request answered by the last of the replicas to
  answer one (``x-serve-app-replica`` header), under closed-loop load from /readyz 200 on;
- ``cli_ready_s``: to the first 0.1 s poll of its output showing its "serving at" line (its
  own check: every replica running, nothing degraded).

Each cold row also has ``timeline`` (timeline.py): from the Ray session's own logs, seconds
after the spawn at which Ray's GCS started, the driver connected, the first worker started,
Serve's controller started, got the deploy, built the app and asked for the replicas, and the
first and last replica began and finished initialising and were marked running.

Then SIGINT (Ctrl-C); the next repeat waits until the CLI has exited and the port is free. Any
process of the CLI's tree still alive 10 s after it exited is SIGKILLed, by pid (never by name).

``replacement`` (rows ``replacement``): one cluster in this process (harness's start_cluster: the
CLI's HAProxy and reliability settings), the same app args, 4 replicas (2 on a CPU), under
closed-loop load from 4 clients. Each repeat SIGKILLs one replica that HAProxy has UP:

- ``replacement_s``: from just before the kill to the end of the first request answered by a
  replica id not seen before the kill;
- ``replacement_up_s``: to the first HAProxy poll (every 0.2 s) with that new replica UP (so
  up to 0.2 s late: it can come after ``replacement_s``).

The next kill waits until the deployment is whole again (harness.cluster.wait_whole).

``decision`` (rows ``decision``): in the same cluster, an autoscaling app with
configs/controller.yaml's HeadroomPolicy settings from 1 to 4 replicas (2 on a CPU), cooldowns
cut to 1 s up and 3 s down and a 2 s load window (rows.COOLDOWNS_S, LOOK_BACK_PERIOD_S), ramped
up under closed-loop load (16 clients; 8 on a CPU). Every scale-up decision of a ramp is a row
(1 -> 4 gives 3); then the load stops, the app scales back to 1, and the next ramp starts, until
``--repeats`` rows or the budget.
``decision_to_serving_s``, in epoch seconds (time.time) at both ends:

- starts at the policy's decision: the time (1 ms) of its ``serve_app autoscale APP/model: a ->
  b (scale_up)`` line in the Serve controller's log, written in the control-loop tick that
  decides (``decision_source: controller_log``). The policy also pushes every decision to the
  node monitor (monitor.status_snapshot().decisions), but that keeps only the latest, which a
  ``hold_pending`` record replaces one tick (0.1 s) later: polling it would miss decisions.
  Fallback when the log has none: the first 0.1 s poll of Serve's details showing the new
  target_num_replicas (``decision_source: serve_target``, up to 0.1 s late; every row also
  has this time as ``serve_target_epoch_s``);
- stops at the end of the first request answered by the new replica (the k-th replica id new
  in a ramp is matched with the k-th replica the ramp's scale-up decisions added).

Every row carries ``replicas``: each measured replica's report from GET /v1/memory, with
``startup_phases_s`` (process, partition, weights, graph_capture, calibration, warmup, total),
``first_request_s`` (process start to its first answer), ``calibration_source`` and
``cuda_graph_pool_bytes`` (the reserved bytes graph capture kept; null on a CPU), whose largest
is the row's ``graph_pool_bytes``. ``summary``: per measure n, median, min, max, the target,
``met`` (rows.TARGETS: the median within it; every replica's pool for graph_pool_bytes) and
``enough_samples`` (n >= 5). The bench measures and reports; it never fails on a target.

The calibration cache is a temporary directory for the whole run: the first start measures, the
later ones read it (``calibration_source``). On a CPU the in-process parts give each replica a
quarter of one logical GPU, with NVML scripted (SERVE_APP_FAKE_NVML: 80 GiB, 79 free), so Ray's
fractional placement and the policy's GPU path run as on the GPU host. Only 127.0.0.1 is
targeted; every wait has a deadline, and a watchdog stops every process this one started (by
pid) at ``--budget-s`` + 30 s.

Modules: ``rows`` (configs, rows, log lines and the summary: pure), ``probes`` (HTTP waits and
reports), ``cold``, ``scaling`` (replacement and decision), ``output`` (the JSON document),
``cli``.
"""
