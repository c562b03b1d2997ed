"""``python -m docs_results`` (with ``tools/`` on ``sys.path``): the same as ``bin/docs-results``."""

import sys

from . import main

sys.exit(main())
