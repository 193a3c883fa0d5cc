"""`python -m spectrial.cli`: the same as the `spectrial` command."""

import sys

from spectrial.cli import app

sys.exit(app())
