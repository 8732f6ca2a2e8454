"""Load tools for serve_app, in three rooms (one-off probes live in research/ at the root):

- ``harness``: what the tools share: a local cluster (``cluster``, ``ray_nodes``), the load
  generators (``load``: httpx closed and open loops; ``openloop``: asyncio processes; ``wrk``;
  ``schedule``), NVML (``nvml``), a memory hog (``hog``), plots (``plots``, the extra ``plots``),
  the run's log and JSON (``run``) and the provenance every result records (``meta``);
- user-facing tools: ``python -m load_tests.bench`` (open-loop load against a running server),
  ``locustfile.py`` and ``payloads`` (request bodies);
- ``reliability``: ``faults`` (the CPU fault suite), ``gpu_faults``, ``soak``;
- ``benchmarks``: ``throughput``, ``startup``, ``multigpu`` (two GPUs).

Each tool is ``python -m load_tests.<room>.<tool> --help``.
"""
