import sys

from steady.worker.cli import main

sys.exit(main())
