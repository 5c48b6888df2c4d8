"""Entry point for ``python -m specdec_client``."""

import sys

from .cli import main

sys.exit(main())
