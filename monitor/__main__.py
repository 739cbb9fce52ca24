"""``python -m monitor`` is the same as ``verl-monitor``."""

import sys

from monitor.cli import main

sys.exit(main())
