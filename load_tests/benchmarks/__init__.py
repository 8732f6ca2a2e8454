"""Benchmarks of serve_app, each one command that writes raw JSON:

    python -m load_tests.benchmarks.throughput --out DIR          # wrk and open-loop req/s
    python -m load_tests.benchmarks.startup --device cuda --out startup.json
    python -m load_tests.benchmarks.multigpu --device cuda --out-dir DIR   # two GPUs

Committed results live under benchmarks/results/ at the repository root.
"""
