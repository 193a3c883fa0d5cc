"""`python -m spectrial.cli`: the same as the `spectrial` command."""

import sys

from spectrial import interrupts
from spectrial.cli import app

interrupts.as_command()

sys.exit(app())
