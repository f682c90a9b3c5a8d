"""Upgrade baseline files written in an older schema to the current one, in place.

Every case is kept as an update would write it (a case the current reader cannot use is
dropped, with a note naming it); a file already in the current schema is left alone.
With ``--check`` nothing is written: the exit status says whether a file needs it
(0: none does, 1: one does, 2: a file is missing or unusable).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from pytest_specperf import plain_text
from pytest_specperf.store.baselines import BaselineError, migrate_baselines


def add_parser(sub: Any) -> None:
    m = sub.add_parser(
        "migrate",
        help="rewrite baseline files of an older schema in the current one",
        description=plain_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    m.add_argument("files", metavar="FILE", nargs="+", type=Path, help="baseline YAML files")
    m.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file needs migrating"
    )


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    status = 0
    for path in args.files:
        try:
            m = migrate_baselines(path, write=not args.check)
        except BaselineError as e:
            print(f"specperf migrate: {e}", file=out)
            status = 2
            continue
        if m.old_version == m.new_version:
            print(f"{path}: schema {m.old_version}, current ({m.cases} case(s))", file=out)
            continue
        done = "migrated" if m.written else "needs migrating"
        print(f"{path}: schema {m.old_version} -> {m.new_version}, {done} "
              f"({m.cases} case(s))", file=out)  # fmt: skip
        for note in m.notes:
            print(f"  {note}", file=out)
        if not m.written:
            status = max(status, 1)
    return status
