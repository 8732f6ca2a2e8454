"""``python -m load_tests.benchmarks.throughput``."""

from load_tests.benchmarks.throughput.cli import main

raise SystemExit(main())
