"""`python -m ortlab.cli ...` is `ortlab ...` (binder/postBuild uses it before the script is on PATH)."""

import sys

from ortlab.cli import main

sys.exit(main())
