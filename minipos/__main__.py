"""``python -m minipos``: the ``minipos`` command (``minipos.cli``), for an environment without its script."""

import sys

from .cli import main

if __name__ == "__main__":   # imported (a test walking the package's modules, say), it runs nothing
    sys.exit(main())
