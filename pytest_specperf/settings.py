"""Values a person types, each parsed by one function: shared by the plugin and ``specperf``.

The plugin's options (``plugin/options.py``), the ``specperf`` marker and the
``specperf compare`` / ``specperf calibrate`` commands read the same ideas (tolerance,
attach, processes, ...) through the same parser here; the options they share are defined
once in ``cli/options.py``. A parser takes the text and returns a frozen record, or
raises :class:`BadValue` naming the value and the fix.

Composite values are comma-separated parts, ``VALUE[,key=VALUE]``: ``7%,step=25%``.
Pure: no pytest, no argparse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_specperf.engines.env import MAX_KERNEL_EVERY
from pytest_specperf.judging.budgets import BUDGETS, budget_expectation, parse_budget
from pytest_specperf.judging.noise import MAX_PROCESSES
from pytest_specperf.judging.verdict import (
    DEFAULT_STEP_TOLERANCE,
    DEFAULT_TOLERANCE,
    Tolerances,
    parse_fraction,
)

#: Largest value of a seconds option (one day).
MAX_SECONDS = 86400.0


class BadValue(ValueError):
    """A value that cannot be used; the message names it and says what is valid."""


def _bad(text: object, problem: str, expected: str) -> BadValue:
    return BadValue(f"invalid value {text!r}: {problem}; expected {expected}")


def _text(raw: object, expected: str) -> str:
    """``raw`` as text: a string, or a number (a marker keyword may be ``0.1``)."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise _bad(raw, "not text or a number", expected)
    text = str(raw).strip()
    if not text:
        raise _bad(raw, "empty", expected)
    return text


def _parts(
    raw: object,
    keys: Sequence[str],
    expected: str,
    bare: str | None = None,
    text: str | None = None,
) -> dict[str, str]:
    """``VALUE,key=VALUE,...`` -> ``{key: value}``; a part without ``=`` is ``bare``'s
    value (None: a part without ``=`` is its own key with value "", a switch). ``text``:
    the part of ``raw`` to read (all of it when None)."""
    text = _text(raw, expected) if text is None else text
    known = {k.replace("_", "-"): k for k in keys}  # max_step_ms, max-step-ms: one key
    out: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        given, eq, value = part.partition("=")
        given = (given if eq else bare or part).strip()
        value = value.strip() if eq else ("" if bare is None else part)
        if not part:
            raise _bad(raw, f"empty part in {text!r}", expected)
        if eq and not value:
            raise _bad(raw, f"{given or part!r} has no value", expected)
        key = known.get(given.replace("_", "-"))
        if key is None:
            raise _bad(raw, f"unknown part {given!r} (known: {', '.join(keys)})", expected)
        if key in out:
            raise _bad(raw, f"{key} is given twice", expected)
        out[key] = value
    return out


# -- tolerance ---------------------------------------------------------------------------

TOLERANCE_FORM = "PHASE[,step=STEP]"
_TOLERANCE_EXPECTED = (
    f"{TOLERANCE_FORM} with fractions in (0, 1) or percentages, e.g. 7%, 7%,step=25% or step=30%"
)


@dataclass(frozen=True)
class ToleranceSpec:
    """The tolerances a person gave; a part not given (None) comes from elsewhere.

    ``phase``: phases (judged against the rest of their step), accept length, the
    unaccounted share; ``step``: step time and tokens/s, which carry the noise between
    processes and so need a wider tolerance.
    """

    phase: float | None = None
    step: float | None = None

    @classmethod
    def of(cls, tolerances: Tolerances) -> ToleranceSpec:
        """Both parts of ``tolerances`` (to print them as typed: ``7%,step=25%``)."""
        return cls(phase=tolerances.phase, step=tolerances.step)

    def over(self, base: Tolerances) -> Tolerances:
        """``base`` with the parts given here replacing its own."""
        return Tolerances(
            phase=base.phase if self.phase is None else self.phase,
            step=base.step if self.step is None else self.step,
        )

    def over_spec(self, base: ToleranceSpec) -> ToleranceSpec:
        """``base`` with the parts given here replacing its own (command line over ini)."""
        return ToleranceSpec(
            phase=base.phase if self.phase is None else self.phase,
            step=base.step if self.step is None else self.step,
        )

    def __str__(self) -> str:
        parts = [] if self.phase is None else [tolerance_text(self.phase)]
        parts += [] if self.step is None else [f"step={tolerance_text(self.step)}"]
        return ",".join(parts)


#: The shipped tolerances.
DEFAULT_TOLERANCES = Tolerances(phase=DEFAULT_TOLERANCE, step=DEFAULT_STEP_TOLERANCE)


def tolerance_text(x: float) -> str:
    """A tolerance as the user writes it, the inverse of ``parse_tolerance``: 0.045 is
    "4.5%", 0.07 is "7%"."""
    return f"{x * 100:.6g}%"


def parse_tolerance(raw: object) -> ToleranceSpec:
    """``7%`` (phases), ``7%,step=25%``, ``step=30%``, ``0.07``: the one tolerance parser
    of the plugin, the marker, ``specperf compare`` and ``specperf calibrate``."""
    parts = _parts(raw, ("phase", "step"), _TOLERANCE_EXPECTED, bare="phase")
    values: dict[str, float] = {}
    for key, text in parts.items():
        try:
            values[key] = parse_fraction(text)
        except ValueError:
            problem = f"{key} {text!r} is not a fraction in (0, 1)"
            raise _bad(raw, problem, _TOLERANCE_EXPECTED) from None
    return ToleranceSpec(**values)


# -- steps -------------------------------------------------------------------------------

STEPS_FORM = "N[,warmup=W]"
MIN_STEPS = 4
MAX_STEPS = 100_000
_STEPS_EXPECTED = (
    f"{STEPS_FORM}: N measured decode steps in [{MIN_STEPS}, {MAX_STEPS}], W warm-up "
    f"steps in [0, {MAX_STEPS}]: e.g. 32, 32,warmup=8 or warmup=2"
)


@dataclass(frozen=True)
class StepsSpec:
    """Measured and warm-up decode steps per case; None: not given here."""

    steps: int | None = None
    warmup: int | None = None

    def over_spec(self, base: StepsSpec) -> StepsSpec:
        return StepsSpec(
            steps=base.steps if self.steps is None else self.steps,
            warmup=base.warmup if self.warmup is None else self.warmup,
        )


def _int(raw: object, key: str, text: str, lo: int, hi: int, expected: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise _bad(raw, f"{key} {text!r} is not an integer", expected) from None
    if not lo <= v <= hi:
        raise _bad(raw, f"{key} {v} is not in [{lo}, {hi}]", expected)
    return v


def parse_steps(raw: object) -> StepsSpec:
    """``32``, ``32,warmup=8``, ``warmup=2``."""
    parts = _parts(raw, ("steps", "warmup"), _STEPS_EXPECTED, bare="steps")
    lows = {"steps": MIN_STEPS, "warmup": 0}
    return StepsSpec(
        **{k: _int(raw, k, v, lows[k], MAX_STEPS, _STEPS_EXPECTED) for k, v in parts.items()}
    )


# -- budgets -----------------------------------------------------------------------------

BUDGET_FORM = "NAME=LIMIT"
_BUDGETS_EXPECTED = f"{BUDGET_FORM}[,...], e.g. max_step_ms=200 or min_active_share=50%"


def parse_budgets(raw: object) -> dict[str, float]:
    """``max_step_ms=200,min_accept_len=2.5`` -> ``{name: limit}`` (``judging.budgets``)."""
    parts = _parts(raw, tuple(BUDGETS), _BUDGETS_EXPECTED)
    out = {}
    for name, text in parts.items():
        if not text:
            raise _bad(raw, f"{name} has no limit", _BUDGETS_EXPECTED)
        try:
            out[name] = parse_budget(name, text)
        except ValueError:
            problem = f"{name} {text!r} is not {budget_expectation(name)}"
            raise _bad(raw, problem, _BUDGETS_EXPECTED) from None
    return out


# -- attach ------------------------------------------------------------------------------

ATTACH_FORM = "URL[,run-dir=DIR]"
_ATTACH_EXPECTED = (
    f"{ATTACH_FORM}: a running server's base URL, and its step-record directory when "
    "/server_info does not say it: e.g. http://127.0.0.1:30000"
)


@dataclass(frozen=True)
class Attach:
    """A running server to measure instead of launching one."""

    url: str
    #: its step-record directory (None: from its /server_info)
    run_dir: Path | None = None

    def __str__(self) -> str:
        return self.url if self.run_dir is None else f"{self.url},run-dir={self.run_dir}"


def parse_attach(raw: object) -> Attach:
    """``http://127.0.0.1:30000`` or ``http://127.0.0.1:30000,run-dir=/tmp/specperf-run``."""
    from pytest_specperf.server.client import check_url

    text = _text(raw, _ATTACH_EXPECTED)
    url, _, rest = text.partition(",")
    try:
        url = check_url(url.strip())
    except ValueError as e:
        raise _bad(raw, str(e), _ATTACH_EXPECTED) from None
    parts = _parts(raw, ("run-dir",), _ATTACH_EXPECTED, text=rest) if rest else {}
    if parts.get("run-dir") == "":  # run-dir without =
        raise _bad(raw, "run-dir needs a directory: run-dir=DIR", _ATTACH_EXPECTED)
    run_dir = parts.get("run-dir")
    return Attach(url, Path(run_dir) if run_dir else None)


# -- profile -----------------------------------------------------------------------------

PROFILE_FORM = "nvtx,kernels=N,on-regression"
_PROFILE_EXPECTED = (
    "any of nvtx (an NVTX range per phase and step, for Nsight Systems), kernels=N (the "
    "kernels of every N-th step; 0: off), on-regression (a PyTorch profiler trace of a "
    "regressed case's re-run), comma-separated; or none"
)


@dataclass(frozen=True)
class Profile:
    """What the run profiles beyond its phase timings."""

    nvtx: bool = False
    #: every N-th decode step's kernels (0: off; None: the server's default, 16 on a GPU)
    kernel_every: int | None = None
    on_regression: bool = False

    @property
    def launch_only(self) -> tuple[str, ...]:
        """The parts that configure a server the plugin launches."""
        return (("nvtx",) if self.nvtx else ()) + (
            () if self.kernel_every is None else ("kernels",)
        )


def parse_profile(raw: object) -> Profile:
    """``nvtx``, ``kernels=16``, ``on-regression``, comma-separated; ``none``: nothing."""
    parts = _parts(raw, ("nvtx", "kernels", "on-regression", "none"), _PROFILE_EXPECTED)
    if "none" in parts:
        if len(parts) > 1:
            raise _bad(raw, "none with other parts", _PROFILE_EXPECTED)
        return Profile()
    for switch in ("nvtx", "on-regression", "none"):
        if parts.get(switch):
            raise _bad(raw, f"{switch} takes no value", _PROFILE_EXPECTED)
    every = None
    if "kernels" in parts:
        if not parts["kernels"]:
            raise _bad(raw, "kernels needs a number, e.g. kernels=16", _PROFILE_EXPECTED)
        every = _int(raw, "kernels", parts["kernels"], 0, MAX_KERNEL_EVERY, _PROFILE_EXPECTED)
    return Profile(nvtx="nvtx" in parts, kernel_every=every, on_regression="on-regression" in parts)


# -- plain numbers -----------------------------------------------------------------------


def parse_processes(raw: object) -> int:
    """Server processes a case is measured in: an integer in [1, MAX_PROCESSES]."""
    expected = f"an integer in [1, {MAX_PROCESSES}]"
    return _int(raw, "processes", _text(raw, expected), 1, MAX_PROCESSES, expected)


def parse_max_time(raw: object) -> float:
    """Seconds a case may take before it is judged (0: no automatic extension)."""
    expected = f"seconds in [0, {MAX_SECONDS:g}] (0: no automatic extension)"
    try:
        value = float(_text(raw, expected))
    except ValueError:
        raise _bad(raw, "not a number", expected) from None
    if not (math.isfinite(value) and 0 <= value <= MAX_SECONDS):
        raise _bad(raw, "out of range", expected)
    return value


# -- A/B in one run ----------------------------------------------------------------------

AB_FORM = "python=PATH[,args=ARGS] | args=ARGS | url=URL[,run-dir=DIR]"
_AB_EXPECTED = (
    f"{AB_FORM}: the reference side measured beside this build in the same run: another "
    "Python environment's interpreter (python=/opt/release/bin/python), this build with "
    'other server arguments (args="--attention-backend triton"; args= takes the rest of '
    "the value), or a running server (url=http://127.0.0.1:30000)"
)


@dataclass(frozen=True)
class ABSpec:
    """The reference side (A) of an A/B run; the build under test (B) is what the other
    options describe. A is launched with ``python`` (None: this interpreter) and B's server
    arguments followed by ``args`` (a flag given again takes the later value), or it is
    the running server at ``url``."""

    python: str | None = None
    args: tuple[str, ...] = ()
    url: str | None = None
    #: the attached reference server's step-record directory (None: from /server_info)
    run_dir: Path | None = None

    def __str__(self) -> str:
        import shlex

        if self.url is not None:
            where = f"url={self.url}"
            return where if self.run_dir is None else f"{where},run-dir={self.run_dir}"
        parts = [] if self.python is None else [f"python={self.python}"]
        parts += [f"args={shlex.join(self.args)}"] if self.args else []
        return ",".join(parts)

    @property
    def launched(self) -> bool:
        """Whether the plugin launches the reference side's servers (not ``url``)."""
        return self.url is None


def _ab_python(raw: object, text: str) -> str:
    path = Path(text).expanduser()
    if not path.is_absolute():
        raise _bad(raw, f"python {text!r} is not an absolute path", _AB_EXPECTED)
    if not path.is_file():
        raise _bad(
            raw,
            f"python {text!r} does not exist (the other environment's interpreter, e.g. "
            "/opt/release/bin/python)",
            _AB_EXPECTED,
        )
    import os

    if not os.access(path, os.X_OK):
        raise _bad(raw, f"python {text!r} is not executable", _AB_EXPECTED)
    return str(path)


def parse_ab(raw: object) -> ABSpec:
    """``python=PATH[,args=ARGS]``, ``args=ARGS`` or ``url=URL[,run-dir=DIR]``: the one
    parser of ``--specperf-ab`` (and ``specperf calibrate --ab``). ``args=`` takes the rest
    of the value, commas included, split as a shell would (``shlex``)."""
    import shlex

    text = _text(raw, _AB_EXPECTED)
    head, sep, args_text = text.partition("args=")
    if sep and head and not head.rstrip().endswith(","):
        raise _bad(raw, "args= must start a part (after a comma)", _AB_EXPECTED)
    head = head.rstrip().rstrip(",").strip()
    parts = _parts(raw, ("python", "url", "run-dir"), _AB_EXPECTED, text=head) if head else {}
    args: tuple[str, ...] = ()
    if sep:
        try:
            args = tuple(shlex.split(args_text))
        except ValueError as e:
            raise _bad(raw, f"args {args_text!r} cannot be split ({e})", _AB_EXPECTED) from None
        if not args:
            raise _bad(raw, "args= has no arguments", _AB_EXPECTED)
    if "url" in parts:
        if "python" in parts or args:
            raise _bad(
                raw,
                "url= measures a running server: python= and args= configure a server the "
                "plugin launches; give one or the other",
                _AB_EXPECTED,
            )
        from pytest_specperf.server.client import check_url

        try:
            url = check_url(parts["url"])
        except ValueError as e:
            raise _bad(raw, str(e), _AB_EXPECTED) from None
        run_dir = parts.get("run-dir")
        return ABSpec(url=url, run_dir=Path(run_dir) if run_dir else None)
    if "run-dir" in parts:
        raise _bad(raw, "run-dir= goes with url= only", _AB_EXPECTED)
    if "python" in parts and not parts["python"]:
        raise _bad(raw, "python needs a value: python=PATH", _AB_EXPECTED)
    if "python" not in parts and not args:
        raise _bad(raw, "no reference side given", _AB_EXPECTED)
    python = _ab_python(raw, parts["python"]) if "python" in parts else None
    return ABSpec(python=python, args=args)
