"""``python -m rtpool.worker``: the same as ``rtpool worker``."""

import sys

from ._supervisor import main

sys.exit(main())
