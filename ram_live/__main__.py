"""``python -m ram_live``: the ``ram-live`` command."""

import sys

from .cli import main

sys.exit(main())
