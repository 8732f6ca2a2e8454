"""``python -m load_tests.benchmarks.startup``: see the package docstring."""

import sys

from load_tests.benchmarks.startup.cli import main

sys.exit(main())
