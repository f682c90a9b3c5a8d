"""Option definitions the commands share with the plugin, after pytest-benchmark's
``add_display_options(addoption, prefix)``: ``--tolerance`` of ``specperf compare`` and
``--specperf-tolerance`` of pytest are one definition with two prefixes, parsed by the one
parser of ``pytest_specperf.settings``.

``addoption`` is pytest's ``group.addoption`` or argparse's ``add_argument``. A parser is
given as ``type=`` through :func:`arg_type`, so that its message follows the flag's name
(``argument --specperf-tolerance: invalid value '7': ...``). Old spellings are registered
hidden, and using one is an error that names the new spelling.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from pytest_specperf.settings import (
    ATTACH_FORM,
    TOLERANCE_FORM,
    BadValue,
    parse_attach,
    parse_max_time,
    parse_processes,
    parse_tolerance,
)

#: ``group.addoption`` (pytest) or ``add_argument`` (argparse).
AddOption = Callable[..., Any]
T = TypeVar("T")


def arg_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as argparse's ``type=``: its ``BadValue`` becomes the error argparse
    prints after the flag's name (a plain ``ValueError`` would print only "invalid
    value")."""

    @functools.wraps(parse)
    def parse_arg(text: str) -> T:
        try:
            return parse(text)
        except BadValue as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse_arg


def add_tolerance_option(addoption: AddOption, prefix: str, help: str, **extra: Any) -> None:
    """``--{prefix}tolerance PHASE[,step=STEP]``."""
    addoption(
        f"--{prefix}tolerance",
        type=arg_type(parse_tolerance),
        metavar=TOLERANCE_FORM,
        help=help,
        **extra,
    )


def add_attach_option(addoption: AddOption, prefix: str, help: str, **extra: Any) -> None:
    """``--{prefix}attach URL[,run-dir=DIR]``."""
    addoption(
        f"--{prefix}attach", type=arg_type(parse_attach), metavar=ATTACH_FORM, help=help, **extra
    )


def add_processes_option(addoption: AddOption, prefix: str, help: str, **extra: Any) -> None:
    """``--{prefix}processes N``."""
    addoption(
        f"--{prefix}processes", type=arg_type(parse_processes), metavar="N", help=help, **extra
    )


def add_max_time_option(addoption: AddOption, prefix: str, help: str, **extra: Any) -> None:
    """``--{prefix}max-time SECONDS``."""
    addoption(
        f"--{prefix}max-time", type=arg_type(parse_max_time), metavar="SECONDS", help=help, **extra
    )


class Replaced(argparse.Action):
    """An old spelling: using it is an error that says what replaced it (``help``: what
    the error says after the flag, e.g. "was replaced by --specperf-attach URL")."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        self.message = kwargs.pop("help")
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        raise argparse.ArgumentError(self, self.message)


def add_replaced_options(addoption: AddOption, replaced: Mapping[str, tuple[str, bool]]) -> None:
    """Old flags refused by name: ``{old flag: (what the error says after the flag,
    whether the flag took a value)}``."""
    for flag, (message, takes_value) in replaced.items():
        dest = "replaced_" + flag.lstrip("-").replace("-", "_")
        addoption(flag, action=Replaced, nargs=None if takes_value else 0, dest=dest, help=message)
