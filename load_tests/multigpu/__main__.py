import sys

from load_tests.multigpu.cli import main

sys.exit(main())
