"""`python -m multibranch ...` (also what `torchrun -m multibranch train ...` runs)."""

import sys

from multibranch.cli import main

sys.exit(main())
