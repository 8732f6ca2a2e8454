"""``python -m load_tests.side_by_side``: see the package docstring."""

import sys

from load_tests.side_by_side.cli import main

sys.exit(main())
