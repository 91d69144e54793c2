"""`python -m xtune.cli ...`: the same as the `xtune` console script."""

import sys

from xtune.cli import main

sys.exit(main())
