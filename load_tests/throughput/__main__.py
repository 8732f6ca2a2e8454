"""``python -m load_tests.throughput``."""

from load_tests.throughput.cli import main

raise SystemExit(main())
