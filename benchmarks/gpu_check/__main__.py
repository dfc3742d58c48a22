"""``python -m benchmarks.gpu_check``: the driver's `main` (the models' workers run as this too)."""

import sys

from benchmarks.gpu_check.driver import main

sys.exit(main())
