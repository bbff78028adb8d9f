"""`python -m blok_tui`: the same as the `blok-tui` command."""

import sys

from blok_tui.cli import main

sys.exit(main())
