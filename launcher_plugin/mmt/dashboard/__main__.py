"""``python -m mmt.dashboard DIR ...``: the same as ``mmt dashboard DIR ...``."""

import sys

from mmt.dashboard.server import main

sys.exit(main())
