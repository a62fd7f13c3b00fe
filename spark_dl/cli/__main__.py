"""``python -m spark_dl.cli``: the ``spark-dl`` command, for an environment without the
installed script."""

import sys

from spark_dl.cli import main

sys.exit(main())
