"""``specperf sglang-check``: the command line of ``engines.sglang.check`` (which reads
SGLang's source against the phase map; its docstring is the command's description)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import Any

from pytest_specperf import plain_text
from pytest_specperf.engines.sglang import check


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "sglang-check",
        help="check the SGLang phase map against SGLang's source (installed or a fork)",
        description=plain_text(check.__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument(
        "--source",
        metavar="PATH",
        help="SGLang source to read: a checkout (its python/ directory or the repository) or "
        "the sglang package directory (default: the installed SGLang)",
    )
    c.add_argument(
        "--phase-map",
        metavar="FILE",
        help=f"your phase map, added to the built-in one (default: ${check.ENV_PHASE_MAP})",
    )
    c.add_argument(
        "--algorithm",
        metavar="NAME",
        help="only the entries the backend installs for this --speculative-algorithm",
    )
    c.add_argument(
        "--step",
        action="append",
        default=[],
        metavar="TARGET",
        help="also list the calls of this step method (sglang.module.Class.method), e.g. "
        "of a worker you are writing a map for (repeatable)",
    )
    c.add_argument(
        "--all",
        action="store_true",
        help="list every uncovered call, also library calls and methods of objects",
    )
    c.add_argument("--format", choices=("text", "json"), default="text")


def run(args: argparse.Namespace) -> int:
    phase_map = args.phase_map or os.environ.get(check.ENV_PHASE_MAP) or None
    try:
        report = check.build_report(args.source, phase_map, args.algorithm, tuple(args.step))
    except check.CheckError as e:
        print(f"specperf sglang-check: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(asdict(report) | {"ok": report.ok}, indent=2))
    else:
        print(check.render_text(report, show_all=args.all))
    return 0 if report.ok else 1
