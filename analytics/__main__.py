"""``python -m analytics``: the analysis job (see :mod:`analytics.job` for the options)."""

from __future__ import annotations

import sys

from analytics.job import main

if __name__ == "__main__":
    sys.exit(main())
