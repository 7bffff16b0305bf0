"""``python -m minipos``: the ``minipos`` command (``minipos.cli``), for an environment without its script."""

import sys

from .cli import main

sys.exit(main())
