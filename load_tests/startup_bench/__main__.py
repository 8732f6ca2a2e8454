"""``python -m load_tests.startup_bench``: see the package docstring."""

import sys

from load_tests.startup_bench.cli import main

sys.exit(main())
