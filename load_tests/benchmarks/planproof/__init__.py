"""The planner's proof (issue 27): the plan deployed and measured, against equal shares.

In one run, on one GPU (or, with ``--quick``, on the CPU as a dry run of the tool):

1. plans CONFIG from the measurements file with serve_app.plan (``write_plan``, the code
   ``serve-app plan`` runs: p99 targets and loads come from the measurements), into OUT/plan/;
2. deploys the plan's serve config as ``serve-app run`` does (derive.for_run, launch.run: local
   Ray, HAProxy) and waits until every application is ready;
3. offers each model's route the rate plan.json predicts for it (its stated load, or for a
   model planned by weight its predicted throughput), open loop with Poisson arrivals, every
   route at once, for a warm-up and then ``--duration-s``; per model: offered and answered
   req/s, p50/p99, errors, and goodput (requests answered within the model's p99 target, a
   second);
4. samples NVML per replica process every 0.1 s against each replica's budget throughout
   (the stack benchmark's BudgetWatch; on the CPU it records that there is no NVML);
5. deletes the applications and deploys the naive config (``proof.naive_config``: the same
   applications and total GPU share, split equally, the same replica count for every model),
   and offers it the same loads;
6. writes OUT/planproof.json (rewritten as each phase ends) with the settings, the run's meta
   (commit), the plan, the rows of both configs, the watches and the verdict (``proof.verdict``).

    python -m load_tests.benchmarks.planproof --out DIR                  # the H200
    python -m load_tests.benchmarks.planproof --out DIR --quick          # a CPU dry run

Modules: ``proof`` (pure: the naive config, goodput, rows, the verdict), ``cli`` (the phases).
``cpu-measurements.json`` is the dry run's measurements file (assumptions, sized for 2 cores).
"""
