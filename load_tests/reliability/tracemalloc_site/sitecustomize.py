"""Put on a replica's PYTHONPATH by ``soak --tracemalloc-dir`` only: starts
load_tests.reliability.tracemem's snapshot thread when SOAK_TRACEMALLOC_DIR is set."""

import os

if os.environ.get("SOAK_TRACEMALLOC_DIR"):
    from load_tests.reliability import tracemem

    tracemem.start_from_env()
