"""``python -m pytest_specperf``: the ``specperf`` command (``cli.main``)."""

from __future__ import annotations

import sys

from pytest_specperf.cli.main import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
