"""Command-line options, their ini twins, and validation into one ``Settings`` object.

Every option ``--specperf-X`` has an ini twin ``specperf_X`` (``specperf_server_args`` and
``specperf_budgets`` for the repeatable two); the command line wins. For the values made
of parts (``--specperf-tolerance 7%,step=25%``, ``--specperf-steps 32,warmup=8``,
``--specperf-budget NAME=LIMIT``) it wins part by part: a part the command line leaves
out comes from the ini file, then from the default. A few rarely changed knobs are
ini-only. Each option is parsed by its own ``type=`` function, defined next to it (the
shared ones in ``pytest_specperf.settings``), whose error names the flag (or the ini
option), the value and the fix. Old spellings are refused with the new one.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_specperf.cli.options import (
    add_attach_option,
    add_max_time_option,
    add_processes_option,
    add_replaced_options,
    add_tolerance_option,
    arg_type,
)
from pytest_specperf.judging.baselines import DEFAULT_KEEP_RUNS
from pytest_specperf.judging.budgets import BUDGETS, Budgets
from pytest_specperf.probe.inject import InjectSpec, parse_inject
from pytest_specperf.server.protocol import BackendSettings
from pytest_specperf.settings import (
    BUDGET_FORM,
    DEFAULT_TOLERANCES,
    PROFILE_FORM,
    STEPS_FORM,
    Attach,
    BadValue,
    Profile,
    StepsSpec,
    ToleranceSpec,
    parse_attach,
    parse_budgets,
    parse_max_time,
    parse_processes,
    parse_profile,
    parse_steps,
    parse_tolerance,
)
from pytest_specperf.store.baseline_schema import MAX_RUNS

DEFAULT_STEPS = 32
DEFAULT_WARMUP_STEPS = 8
DEFAULT_LONG_CONTEXT_MIN = 32768
DEFAULT_READY_TIMEOUT_S = 600.0
#: Seconds a case may take in all (every process, every round) before it is judged: the
#: automatic extension's budget (0: no extension).
DEFAULT_MAX_TIME_S = 30.0
#: Largest accepted ``specperf_baseline_max_mb``, in MiB.
MAX_BASELINE_MB = 65536.0

#: One value's parser: text -> value; ``BadValue`` (its message names the value and fix).
Parse = Callable[[str], Any]


def _usage(source: str, value: Any, expected: str) -> pytest.UsageError:
    return pytest.UsageError(f"{source}: invalid value {value!r}; expected {expected}")


def _bad(text: str, expected: str) -> BadValue:
    return BadValue(f"invalid value {text!r}; expected {expected}")


def _int_in(lo: int, hi: int) -> Parse:
    def parse_int(text: str) -> int:
        try:
            v = int(text.strip())
        except ValueError:
            raise _bad(text, f"an integer in [{lo}, {hi}]") from None
        if not lo <= v <= hi:
            raise _bad(text, f"an integer in [{lo}, {hi}]")
        return v

    return parse_int


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 1 <= value <= 86400:  # NaN fails too
        raise _bad(text, "seconds in [1, 86400]")
    return value


def _backend(text: str) -> str:
    from pytest_specperf.engines import backend_names

    name = text.strip()
    if name not in backend_names():
        raise _bad(text, f"one of: {', '.join(backend_names())}")
    return name


def _device_slug(text: str) -> str:
    from pytest_specperf.telemetry.device import validate_slug

    try:
        return validate_slug(text)
    except ValueError:
        raise _bad(
            text,
            "a lowercase slug like nvidia-h200 or cpu-amd-epyc-7b13-2c "
            "([a-z0-9][a-z0-9._-]*, at most 80 characters)",
        ) from None


def _text(text: str) -> str:
    return text


def _server_arg(text: str) -> str:
    if not text.strip():
        raise _bad(text, "a server argument such as --page-size=16 (not empty)")
    return text


def _inject(text: str) -> InjectSpec:
    try:
        return parse_inject(text)
    except ValueError as e:
        raise BadValue(f"invalid value {text!r}: {e}") from None


def _baseline_max_bytes(text: str) -> int:
    """MiB -> bytes."""
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not 0 < mb <= MAX_BASELINE_MB:  # NaN fails too
        raise _bad(text, f"a size in MiB in (0, {MAX_BASELINE_MB:g}], e.g. 32")
    return max(1, int(mb * 1024 * 1024))


def destination_problem(path: Path) -> str | None:
    """Why a report cannot be written to ``path`` (a directory, no permission), or None.

    Checked before any server starts, so a bad destination costs no measurement. A
    missing parent directory is fine where it can be created. The check writes: it opens
    an existing file for appending, or creates and removes a probe file in the nearest
    existing directory (permission bits alone do not tell, e.g. for root or a read-only
    mount).
    """
    if path.is_dir():
        return "a file path (this path is a directory)"
    try:
        if path.exists():
            with open(path, "a", encoding="utf-8"):
                return None
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            return f"a file path ({parent} is not a directory)"
        with tempfile.TemporaryFile(dir=parent):
            return None
    except OSError as e:
        return f"a file path this user may write ({e.strerror or e})"


@dataclass(frozen=True)
class _Opt:
    """One option: ``--specperf-{name}`` and its ini twin."""

    name: str
    help: str
    parse: Parse = _text
    #: value | flag | list (repeatable) | ini (ini-only) | shared (added by ``add``)
    kind: str = "value"
    metavar: str | None = None
    #: the ini twin's name where it is not ``specperf_{name}``
    ini_name: str | None = None
    #: ``add(addoption, prefix, help)`` from ``pytest_specperf.settings`` (kind "shared")
    add: Callable[..., None] | None = None

    @property
    def flag(self) -> str:
        return f"--specperf-{self.name}"

    @property
    def dest(self) -> str:
        return "specperf_" + self.name.replace("-", "_")

    @property
    def ini(self) -> str:
        return self.ini_name or self.dest


OPTIONS: tuple[_Opt, ...] = (
    _Opt("backend", "reference (embedded engine, default) or sglang", _backend, metavar="NAME"),
    _Opt("model", "SGLang model path or id, or reference config tiny|medium", metavar="MODEL"),
    _Opt("draft-model", "SGLang draft model path or id", metavar="MODEL"),
    _Opt(
        "server-arg",
        "server argument passed as is (repeatable)",
        _server_arg,
        kind="list",
        metavar="ARG",
        ini_name="specperf_server_args",
    ),
    _Opt(
        "attach",
        "measure this running server, launch none",
        parse_attach,
        kind="shared",
        add=add_attach_option,
    ),
    _Opt("baselines", "baseline directory (default: baselines/ at rootdir)", metavar="DIR"),
    _Opt(
        "device",
        "baseline file name (default: detected, e.g. nvidia-h200)",
        _device_slug,
        metavar="SLUG",
    ),
    _Opt("update-baselines", "record this run's cases as the new baselines", kind="flag"),
    _Opt(
        "tolerance",
        f"allowed change (default {ToleranceSpec.of(DEFAULT_TOLERANCES)})",
        parse_tolerance,
        kind="shared",
        add=add_tolerance_option,
    ),
    _Opt(
        "budget",
        "hard limit, e.g. max_step_ms=200 (repeatable)",
        parse_budgets,
        kind="list",
        metavar=BUDGET_FORM,
        ini_name="specperf_budgets",
    ),
    _Opt(
        "steps",
        f"decode steps per case (default {DEFAULT_STEPS},warmup={DEFAULT_WARMUP_STEPS})",
        parse_steps,
        metavar=STEPS_FORM,
    ),
    _Opt(
        "processes",
        "server processes per case (default 1)",
        parse_processes,
        kind="shared",
        add=add_processes_option,
    ),
    _Opt(
        "max-time",
        f"seconds a noisy case may run on (default {DEFAULT_MAX_TIME_S:g}; 0: never)",
        parse_max_time,
        kind="shared",
        add=add_max_time_option,
    ),
    _Opt("history", "earlier runs' JSON reports: evidence of noise", metavar="DIR"),
    _Opt("json", "write every case as JSON to PATH (and PATH.svg)", metavar="PATH"),
    _Opt("markdown", "write the summary as Markdown to PATH", metavar="PATH"),
    _Opt("strict", "fail every case not judged (NO_BASELINE, UNSTABLE, ...)", kind="flag"),
    _Opt(
        "inject",
        "canary slowdown, e.g. verify=1.10 (never recorded)",
        _inject,
        metavar="PHASE=FACTOR[,...]",
    ),
    _Opt(
        "profile",
        "NVTX ranges, kernel samples (GPU: 16), regression trace",
        parse_profile,
        metavar=PROFILE_FORM,
    ),
    # ini-only: rarely changed
    _Opt(
        "long-context-min",
        "cases with a context length at or above this get the long_context marker "
        f"(default {DEFAULT_LONG_CONTEXT_MIN})",
        _int_in(1, 10**9),
        kind="ini",
    ),
    _Opt(
        "keep-runs",
        f"runs kept per case by --specperf-update-baselines, the newest (default "
        f"{DEFAULT_KEEP_RUNS})",
        _int_in(1, MAX_RUNS),
        kind="ini",
        metavar="K",
    ),
    _Opt(
        "baseline-max-mb",
        "largest baseline file read or written, in MiB (default 8, or "
        "SPECPERF_BASELINE_MAX_MB); a larger file is refused before it is parsed",
        _baseline_max_bytes,
        kind="ini",
        metavar="MIB",
    ),
    _Opt(
        "ready-timeout",
        "seconds a launched server may take to answer /health_generate (default "
        f"{DEFAULT_READY_TIMEOUT_S:.0f})",
        _seconds,
        kind="ini",
        metavar="SECONDS",
    ),
)
_BY_NAME = {o.name: o for o in OPTIONS}

#: Options that were flags too once.
_NOW_INI_ONLY = ("keep-runs", "baseline-max-mb", "ready-timeout")
#: Old flags -> (what replaced them, whether they took a value).
REPLACED_FLAGS: dict[str, tuple[str, bool]] = {
    "--specperf-step-tolerance": (
        "--specperf-tolerance PHASE,step=STEP, e.g. --specperf-tolerance 7%,step=25% "
        "(or step=25% alone)",
        True,
    ),
    "--specperf-server-url": ("--specperf-attach URL", True),
    "--specperf-run-dir": ("--specperf-attach URL,run-dir=DIR", True),
    "--specperf-nvtx": ("--specperf-profile nvtx", False),
    "--specperf-kernel-every": ("--specperf-profile kernels=N", True),
    "--specperf-profile-on-regression": ("--specperf-profile on-regression", False),
    "--specperf-warmup-steps": ("--specperf-steps N,warmup=W (or warmup=W alone)", True),
    **{
        "--specperf-" + name.replace("_", "-"): (f"--specperf-budget {name}=LIMIT", True)
        for name in BUDGETS
    },
}
#: Old ini-option spellings -> what replaced them.
REPLACED_INI: dict[str, str] = {
    "specperf_step_tolerance": "specperf_tolerance = PHASE,step=STEP",
    "specperf_server_url": "specperf_attach = URL",
    "specperf_run_dir": "specperf_attach = URL,run-dir=DIR",
    "specperf_nvtx": "specperf_profile = nvtx",
    "specperf_kernel_every": "specperf_profile = kernels=N",
    "specperf_profile_on_regression": "specperf_profile = on-regression",
    "specperf_warmup_steps": "specperf_steps = N,warmup=W",
    **{f"specperf_{name}": f"specperf_budgets = {name}=LIMIT (one per line)" for name in BUDGETS},
}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("specperf", "speculative-decoding performance (pytest-specperf)")
    for o in OPTIONS:
        cli_help = o.help.replace("%", "%%")  # argparse formats help with %
        if o.kind == "ini":
            parser.addini(o.ini, o.help, default=None)
            continue
        if o.kind == "flag":
            group.addoption(o.flag, action="store_true", default=None, dest=o.dest, help=cli_help)
            parser.addini(o.ini, o.help, type="bool", default=False)
            continue
        if o.kind == "shared" and o.add is not None:
            o.add(group.addoption, "specperf-", cli_help, default=None, dest=o.dest)
        else:
            group.addoption(
                o.flag,
                action="append" if o.kind == "list" else "store",
                type=arg_type(o.parse),
                default=None,
                dest=o.dest,
                metavar=o.metavar,
                help=cli_help,
            )
        if o.kind == "list":
            parser.addini(o.ini, o.help + ", one per line", type="linelist", default=[])
        else:
            parser.addini(o.ini, o.help, default=None)
    old = {flag: (f"was replaced by {new}", value) for flag, (new, value) in REPLACED_FLAGS.items()}
    for name in _NOW_INI_ONLY:
        o = _BY_NAME[name]
        old[o.flag] = (f"is ini-only now: -o {o.ini}={o.metavar}, or {o.ini} in the ini file", True)
    add_replaced_options(group.addoption, old)
    for name, new in REPLACED_INI.items():
        parser.addini(name, f"refused: now {new.split(' = ')[0]}", default=None)


@dataclass(frozen=True)
class _Given:
    """One option's value from the command line and from the ini file (None: not given)."""

    option: _Opt
    cli: Any
    ini: Any

    @property
    def value(self) -> Any:
        return self.cli if self.cli is not None else self.ini

    @property
    def source(self) -> str:
        return self.option.flag if self.cli is not None else f"ini option {self.option.ini}"

    @property
    def from_ini(self) -> bool:
        return self.cli is None and self.ini is not None


def _ini_value(config: pytest.Config, o: _Opt) -> Any:
    """The ini twin's value, parsed (None: not set)."""
    raw = config.getini(o.ini)
    if o.kind == "flag":
        return True if raw else None
    if o.kind == "list":
        texts = [str(line) for line in raw]
    else:
        texts = [str(raw)] if raw and str(raw).strip() else []
    if not texts:
        return None
    try:
        values = [o.parse(t) for t in texts]
    except ValueError as e:  # BadValue
        raise pytest.UsageError(f"ini option {o.ini}: {e}") from None
    return values if o.kind == "list" else values[0]


def _cli_value(config: pytest.Config, o: _Opt) -> Any:
    """The command line's value (parsed by argparse through ``type=``; None: not given)."""
    if o.kind == "ini":
        return None
    value = config.getoption(o.dest)
    return value  # "" (--specperf-json=) is given: it clears the ini file's value


def _given(config: pytest.Config) -> dict[str, _Given]:
    return {o.name: _Given(o, _cli_value(config, o), _ini_value(config, o)) for o in OPTIONS}


def _refuse_replaced_ini(config: pytest.Config) -> None:
    for name, new in REPLACED_INI.items():
        if config.getini(name):
            raise pytest.UsageError(f"ini option {name} was replaced by {new}")


@dataclass(frozen=True)
class Settings:
    backend: str
    baselines_dir: Path
    baseline_max_bytes: int | None
    update_baselines: bool
    device_slug: str | None
    tolerance: float
    step_tolerance: float
    steps: int
    warmup_steps: int
    json_path: Path | None
    markdown_path: Path | None
    strict: bool
    server_url: str | None
    run_dir: Path | None
    model: str | None
    draft_model: str | None
    server_args: tuple[str, ...]
    inject: InjectSpec | None
    nvtx: bool
    profile_on_regression: bool
    long_context_min: int
    ready_timeout_s: float
    processes: int = 1
    keep_runs: int = DEFAULT_KEEP_RUNS
    max_time_s: float = DEFAULT_MAX_TIME_S
    history_dir: Path | None = None
    kernel_every: int | None = None
    max_unaccounted_share: float | None = None
    min_active_share: float | None = None
    max_step_ms: float | None = None
    min_accept_len: float | None = None
    min_tokens_per_s: float | None = None
    #: one-line notes for the run's summary (e.g. ini launch settings ignored on attach)
    notes: tuple[str, ...] = ()

    def backend_settings(self, parallel: int = 1) -> BackendSettings:
        """What the backend needs; ``parallel`` servers run side by side (xdist workers)."""
        return BackendSettings(
            model=self.model,
            draft_model=self.draft_model,
            server_args=self.server_args,
            inject=str(self.inject) if self.inject else None,
            nvtx=self.nvtx,
            parallel=parallel,
            kernel_every=self.kernel_every,
        )

    def budgets(self) -> Budgets:
        """The run's budgets (ini or command line); a marker's keywords override them."""
        return Budgets(**{name: getattr(self, name) for name in BUDGETS})


def _from_invocation_dir(raw: str, config: pytest.Config) -> Path:
    """``raw`` as a path, relative to the directory pytest was invoked in."""
    path = Path(raw)
    return path if path.is_absolute() else Path(config.invocation_params.dir) / path


def _baselines_dir(g: _Given, config: pytest.Config) -> Path:
    path = Path(g.value) if g.value else Path("baselines")
    if not path.is_absolute():
        path = config.rootpath / path
    if path.exists() and not path.is_dir():
        raise _usage(g.source, str(g.value), "a directory (this path is a file)")
    return path


def _report_path(g: _Given, config: pytest.Config) -> Path | None:
    """A report file (JSON, Markdown), relative to the current directory."""
    if not g.value:
        return None
    path = _from_invocation_dir(g.value, config)
    problem = destination_problem(path)
    if problem is not None:
        raise _usage(g.source, g.value, problem)
    return path


def _history(g: _Given, config: pytest.Config) -> Path | None:
    if not g.value:
        return None
    path = _from_invocation_dir(g.value, config)
    if not path.is_dir():
        raise _usage(
            g.source, g.value, "a directory of JSON reports (--specperf-json of earlier runs)"
        )
    return path


def _merged_budgets(g: _Given) -> dict[str, float]:
    """The ini file's budgets, then the command line's: a later limit of a name wins."""
    out: dict[str, float] = {}
    for limits in [*(g.ini or ()), *(g.cli or ())]:
        out.update(limits)
    return out


def _launch_settings(given: dict[str, _Given]) -> dict[str, _Given]:
    """The settings given that only apply when the plugin launches the server."""
    out = {n: given[n] for n in ("model", "draft-model", "server-arg") if given[n].value}
    procs = given["processes"]
    if procs.value is not None and procs.value > 1:
        out["processes"] = procs
    profile: Profile | None = given["profile"].value
    if profile is not None and profile.launch_only:
        out["profile"] = given["profile"]
    return out


def _attach_launch(given: dict[str, _Given]) -> tuple[dict[str, _Given], tuple[str, ...]]:
    """Attaching and launch settings together: settings from the ini file are dropped with
    a note when the command line attaches; anything else is a contradiction, refused."""
    attach = given["attach"]
    launch = _launch_settings(given)
    if attach.value is None or not launch:
        return given, ()
    if attach.cli is not None:
        ignored = {n: g for n, g in launch.items() if g.from_ini}
        launch = {n: g for n, g in launch.items() if not g.from_ini}
    else:
        ignored = {}
    if launch:
        names = ", ".join(g.source for g in launch.values())
        verb = "configures" if len(launch) == 1 else "configure"
        raise pytest.UsageError(
            f"{attach.source} measures a running server, and {names} only {verb} a server "
            f"the plugin launches: drop {'it' if len(launch) == 1 else 'them'} or drop "
            f"{attach.source} (NVTX ranges or kernel samples in your own server: "
            "SPECPERF_NVTX=1 or SPECPERF_KERNEL_EVERY=N in its environment)"
        )
    out = dict(given)
    for name, g in ignored.items():
        cleared: Any = None
        if name == "profile":  # keep what applies to an attached server too
            cleared = dataclasses.replace(g.ini, nvtx=False, kernel_every=None)
        out[name] = dataclasses.replace(g, ini=cleared)
    inis = ", ".join(g.option.ini for g in ignored.values())
    inis = inis.replace("specperf_profile", "specperf_profile's nvtx and kernels")
    note = f"attached with {attach.source}: ignored the ini file's launch settings ({inis})"
    return out, (note,)


def _check_combinations(s: Settings, given: dict[str, _Given]) -> None:
    """Options that are valid alone but not together."""
    if s.inject is not None and s.update_baselines:
        raise pytest.UsageError(
            f"{given['inject'].source} cannot be combined with --specperf-update-baselines: an "
            "injected slowdown must never become a baseline; drop one of the two"
        )


def _check_junitxml(config: pytest.Config) -> None:
    """pytest's ``--junitxml`` destination, checked before any server starts (pytest
    itself opens it only at the end of the run)."""
    raw = getattr(config.option, "xmlpath", None)
    if not raw:
        return
    path = Path(os.path.expanduser(os.path.expandvars(raw)))
    if not path.is_absolute():
        path = Path(config.invocation_params.dir) / path
    problem = destination_problem(path)
    if problem is not None:
        raise _usage("--junitxml", raw, problem)


def _ini_only(given: dict[str, _Given], name: str, default: Any) -> Any:
    value = given[name].ini
    return default if value is None else value


def load_settings(config: pytest.Config) -> Settings:
    """Validate every option; raise ``pytest.UsageError`` on the first bad one."""
    _refuse_replaced_ini(config)
    given, notes = _attach_launch(_given(config))
    v = {name: g.value for name, g in given.items()}
    tol_given, steps_given = given["tolerance"], given["steps"]  # the command line by part
    tol = (tol_given.cli or ToleranceSpec()).over_spec(tol_given.ini or ToleranceSpec())
    tolerances = tol.over(DEFAULT_TOLERANCES)
    steps = (steps_given.cli or StepsSpec()).over_spec(steps_given.ini or StepsSpec())
    attach: Attach | None = v["attach"]
    profile: Profile = v["profile"] or Profile()
    budgets = _merged_budgets(given["budget"])
    settings = Settings(
        backend=v["backend"] or "reference",
        baselines_dir=_baselines_dir(given["baselines"], config),
        baseline_max_bytes=given["baseline-max-mb"].ini,
        update_baselines=bool(v["update-baselines"]),
        device_slug=v["device"] or None,
        tolerance=tolerances.phase,
        step_tolerance=tolerances.step,
        steps=DEFAULT_STEPS if steps.steps is None else steps.steps,
        warmup_steps=DEFAULT_WARMUP_STEPS if steps.warmup is None else steps.warmup,
        json_path=_report_path(given["json"], config),
        markdown_path=_report_path(given["markdown"], config),
        strict=bool(v["strict"]),
        server_url=attach.url if attach else None,
        run_dir=attach.run_dir if attach else None,
        model=v["model"] or None,
        draft_model=v["draft-model"] or None,
        server_args=tuple(v["server-arg"] or ()),
        inject=v["inject"] or None,
        nvtx=profile.nvtx,
        profile_on_regression=profile.on_regression,
        long_context_min=_ini_only(given, "long-context-min", DEFAULT_LONG_CONTEXT_MIN),
        ready_timeout_s=_ini_only(given, "ready-timeout", DEFAULT_READY_TIMEOUT_S),
        processes=v["processes"] or 1,
        keep_runs=_ini_only(given, "keep-runs", DEFAULT_KEEP_RUNS),
        max_time_s=DEFAULT_MAX_TIME_S if v["max-time"] is None else v["max-time"],
        history_dir=_history(given["history"], config),
        kernel_every=profile.kernel_every,
        notes=notes,
        **budgets,
    )
    _check_combinations(settings, given)
    _check_junitxml(config)
    return settings
