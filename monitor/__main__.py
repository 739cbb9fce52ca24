"""``python -m monitor`` is the same as ``verl-monitor``."""

import sys

from cli.main import main

sys.exit(main())
