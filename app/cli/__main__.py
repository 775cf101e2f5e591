"""``python -m steady.server.cli``: the same as the ``steady`` command."""

import sys

from steady.server.cli import main

sys.exit(main())
