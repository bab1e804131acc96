"""``python -m rtpool``: the same as the ``rtpool`` command."""

import sys

from .cli import main

sys.exit(main())
