"""``python -m engine.cli``: the ``arena`` command."""
import sys

from .main import main

sys.exit(main())
