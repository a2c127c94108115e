"""`python -m emulator --count 4 --base-port 2201` (no Django needed)."""

import sys

from .cli import main

sys.exit(main())
