"""``python -m load_tests.benchmarks.planproof``."""

from load_tests.benchmarks.planproof.cli import main

raise SystemExit(main())
