"""``python -m load_tests.bench``: see the package docstring."""

import sys

from load_tests.bench.cli import main

sys.exit(main())
