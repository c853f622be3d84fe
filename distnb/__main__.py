"""`python -m distnb`: the `distnb` command, run by this interpreter (`distnb.cli`)."""

import sys

from distnb.cli import main

sys.exit(main())
