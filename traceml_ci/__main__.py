"""``python -m traceml_ci``: the ``traceml-ci`` command, for when its script is not on PATH."""

import sys

from traceml_ci.cli.main import main

sys.exit(main())
