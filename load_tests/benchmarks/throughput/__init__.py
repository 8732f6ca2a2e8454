"""The throughput benchmark that cannot be mistaken for the server's limit.

For each setup (model, replica count at a GPU share that fits one GPU, inputs per request) it
starts serve_app the way ``serve-app run`` does (serve_app.ops.launch, HAProxy ingress, dummy fp16
weights, real defaults otherwise) on the server cores, and measures:

- the maximum throughput with wrk (closed loop, a few connection counts, the best kept);
- the latency at 80% of that rate with an open-loop client in several processes
  (latency from the scheduled send time: no coordinated omission);
- NVML per-process bytes every 0.1 s against each replica's ``budget_bytes``;

beside the references that say what the numbers mean:

- the clients' own ceiling: both clients against HAProxy answering by itself, on the server
  cores, with the same requests and answers of the size serve_app gives (a row is flagged
  when this ceiling is under 3x what the client measured there);
- plain Ray Serve's no-op behind the same HAProxy ingress at the same replica counts;
- the model alone in one process (the in-process ceiling), best over batches;
- two peers with the same model, payloads and clients (MiniLM): plain Ray Serve with
  ``@serve.batch`` behind the same ingress, and LitServe 0.2.19 (the optional extra ``peers``;
  its rows are ``skipped`` without it);
- for every row, the server's CPU seconds per 1,000 requests, read from /proc around each
  client run, split by process kind, and its ratio to the no-op's.

    python -m load_tests.benchmarks.throughput --out DIR [--models minilm,resnet50]
        [--replicas 4,8,12,16] [--inputs-per-request 1,16] [--server-cores 0-15]
        [--client-cores 16-31] [--duration-s S] [--mps] [--max-time-s 540] [--device cpu --quick]
        [--workload short|mixed]
        [--phases ceiling,client,serve,noop,ray_serve_batch,litserve]
    python -m load_tests.benchmarks.throughput.render DIR/throughput.json      # the markdown tables

Writes DIR/throughput.json (a list of rows, rewritten as they arrive), DIR/meta.json (host,
cores, versions, the plan, flags) and DIR/server_reports.json (each job's GET /v1/memory at
its end), and the workers' logs. ``--workload mixed`` loads MiniLM with 64 bodies of queries
or passages (load_tests.workloads.texts) and adds texts/s and tokens/s to the rows, against
the in-process ceiling on the same texts. A setup the time budget does not reach gets a
``skipped`` row with a note; the run logs its plan first (which jobs, about how long, how many fit).
``--merge`` keeps the measured rows of an earlier run's throughput.json that this run did not
measure again (the whole matrix takes more than one 10-minute run on the GPU host).

Modules: ``options`` (command line, cores), ``payload`` (request and answer bodies), ``wrk``
(script, command, output), ``openloop`` (the open-loop client processes), ``noop_server``
(HAProxy's static no-op), ``noop_app`` (plain Ray Serve's no-op), ``stats`` and ``rows`` (pure
functions), ``measure`` (one target, both clients), ``setups`` (configs, payloads and time
estimates per job), ``serve`` (the Ray session and its jobs), ``workers`` (subprocesses),
``cli`` (the phases), ``render``; ``proccpu`` (the server's CPU from /proc), ``peers`` (the
peers' model, parse and answer), ``ray_serve_batch_app`` and ``litserve_app`` (the peers),
``peer_process`` (LitServe as a subprocess).
"""

from __future__ import annotations

from load_tests.benchmarks.throughput.cli import main, plan_jobs
from load_tests.benchmarks.throughput.rows import apply_ceilings, merge_rows
from load_tests.harness.wrk import lua_script, parse_wrk_output

__all__ = ["apply_ceilings", "lua_script", "main", "merge_rows", "parse_wrk_output", "plan_jobs"]
