import sys

from steady.worker.agent.cli import main

sys.exit(main())
