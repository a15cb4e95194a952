"""``python -m typevet_async._cli``: the command line, as the ``typevet-async`` script runs it."""

import sys

from typevet_async._cli import main

sys.exit(main())
