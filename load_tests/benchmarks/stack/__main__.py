"""``python -m load_tests.benchmarks.stack``."""

from load_tests.benchmarks.stack.cli import main

raise SystemExit(main())
