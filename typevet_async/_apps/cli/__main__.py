"""``python -m typevet_async._apps.cli``: the command line, as the ``typevet-async`` script runs
it."""

import sys

from typevet_async._apps.cli import main

sys.exit(main())
