"""`python -m tnt_launch` is the `tnt-launch` command."""

import sys

from tnt_launch.cli import main

sys.exit(main())
