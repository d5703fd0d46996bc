"""``python -m client.admin``: the same as ``trimq-admin``."""

from __future__ import annotations

import sys

from client.admin import main

if __name__ == "__main__":
    sys.exit(main())
