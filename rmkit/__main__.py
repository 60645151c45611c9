"""`python -m rmkit` (and `torchrun -m rmkit`) run the command-line interface."""

import sys

from rmkit.cli import main

sys.exit(main())
