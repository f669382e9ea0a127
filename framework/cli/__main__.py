"""``python -m framework.cli fit conf/x.yaml`` (what torchrun and mpiexec run)."""

import sys

from framework.cli import main

sys.exit(main())
