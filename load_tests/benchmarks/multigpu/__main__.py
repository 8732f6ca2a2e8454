import sys

from load_tests.benchmarks.multigpu.cli import main

sys.exit(main())
