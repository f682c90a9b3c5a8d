"""``specperf`` / ``python -m pytest_specperf``: command-line tools."""

from __future__ import annotations

import argparse

from pytest_specperf import __version__, plain_text
from pytest_specperf.cli import calibrate, compare, history, sglang_check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specperf", description=plain_text(__doc__))
    parser.add_argument("--version", action="version", version=f"pytest-specperf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    calibrate.add_parser(sub)
    history.add_parser(sub)
    compare.add_parser(sub)
    sglang_check.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "calibrate":
        return calibrate.run(args)
    if args.command == "history":
        return history.run(args)
    if args.command == "compare":
        return compare.run(args)
    if args.command == "sglang-check":
        return sglang_check.run(args)
    parser.error(f"unknown command {args.command!r}")
    return 2
