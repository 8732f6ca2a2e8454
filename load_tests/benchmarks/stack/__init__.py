"""The retrieval stack on one GPU (issue 26's proof, its stack half).

Deploys ``configs/rag-stack.yaml`` (embeddings, reranker, text classifier, image classifier on
one GPU and one base URL) the way ``serve-app run`` does, with the config's ``load_format: dummy``
weights, and measures:

- each family's in-process ceiling first, in a process of its own: the application's own model
  (serve_app's backend from its args), fed the benchmark's request through its wire spec, items/s
  per batch size, eager and with CUDA graphs, the best kept (``ceiling``);
- a warm-up with wrk on every route at once;
- each family alone: wrk on its route only (closed loop, ``--connections`` per route);
- all families at once: wrk on every route together, the same connections each;
- throughout, NVML's per-process bytes every 0.1 s, sampled in this process (independent of the
  replicas' own reports), against each replica's ``budget_bytes`` from ``GET /v1/memory``;
- the base URL's ``GET /v1/models``: every family listed with its route.

The verdict (issue 26): each family's p99 with its neighbours at most 1.25x its p99 alone, 0
budget violations, 0 errors; each family's items/s alone and with neighbours beside its ceiling.

    python -m load_tests.benchmarks.stack --out DIR                 # the H200: about 5 minutes
    python -m load_tests.benchmarks.stack --out DIR --quick         # a CPU dry run of the tool
    python -m benchmarks.render                                     # the docs' table

Writes DIR/stack.json (rewritten as phases end) and DIR/ceiling.json. Families whose adapter the
checkout does not have are left out of ``--quick`` with a note (and make a full run fail its
config check). Modules: ``plan`` (pure: families, requests, the quick config, the verdict),
``ceiling`` (the in-process ceiling, run as a subprocess), ``cli`` (the phases).
"""

from __future__ import annotations

from load_tests.benchmarks.stack.plan import P99_RATIO_MAX, families, family_row, verdict

__all__ = ["P99_RATIO_MAX", "families", "family_row", "verdict"]
