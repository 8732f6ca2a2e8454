"""Two GPUs (issue #14), one command in three parts, each writing raw JSON under --out-dir:

    python -m load_tests.benchmarks.multigpu --device cuda --out-dir $OUT/multigpu --budget-s 500
    python -m load_tests.benchmarks.multigpu --device cpu --quick --out-dir /tmp/mg  # <= 6 min

(the second is the CPU dry run.)

1. ``throughput`` (throughput/, load_tests.benchmarks.throughput on one node with both GPUs): 4
   MiniLM replicas at 0.25 of a GPU (Ray packs them on one GPU) against 8 (4 on each), texts/s at 64
   texts per request (the issue wants >= 1.9x) and at 1, wrk on the client half of the cores,
   NVML per process against each replica's budget; the clients' own ceiling against a no-op is
   measured last, with the time left.
2. ``grab`` (grab_timeline.json, .png): a Ray node per GPU, configs/controller.yaml's
   application pinned to each, under load; another process takes GPU 1's memory, holds it and
   frees it; a sample every 0.5 s. Expected: only GPU 1's replicas are shed, GPU 0's serve
   with 0 errors.
3. ``placement`` (placement.json): one node with both GPUs, 6 replicas at 0.3: per GPU UUID the
   replicas, the sum of budgets against the total, NVML per process against each budget.

The parts run in that order (most valuable first), each in its own process with its share of
``--budget-s`` (what one leaves goes to the next); a part that runs out of time keeps what it
measured and says why. multigpu.json sums them up. On the CPU (``--device cpu``) the GPUs are
Ray's logical ones named by a scripted NVML: there is no CUDA and no NVML, and those fields are
null. Modules: ``cli`` (the command), ``rows`` (pure functions), ``grab``, ``timeline``,
``placement``, ``common``.
"""

from load_tests.benchmarks.multigpu.cli import main

__all__ = ["main"]
