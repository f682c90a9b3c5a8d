"""Command-line options, their ini twins, and validation into one ``Settings`` object.

Every option ``--specperf-X`` has an ini twin ``specperf_X``; the command line wins. Each
option is parsed by its own small function, defined next to it, which raises
``pytest.UsageError`` naming the flag (or ini name), the value and what is valid.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_specperf.engines.env import MAX_KERNEL_EVERY
from pytest_specperf.judging.baseline_schema import MAX_RUNS
from pytest_specperf.judging.baselines import DEFAULT_KEEP_RUNS
from pytest_specperf.judging.budgets import BUDGETS, Budgets, budget_expectation, parse_budget
from pytest_specperf.judging.noise import MAX_PROCESSES
from pytest_specperf.judging.verdict import (
    DEFAULT_STEP_TOLERANCE,
    DEFAULT_TOLERANCE,
    parse_fraction,
)
from pytest_specperf.probe.inject import InjectSpec, parse_inject
from pytest_specperf.server.protocol import BackendSettings

DEFAULT_STEPS = 32
DEFAULT_WARMUP_STEPS = 8
DEFAULT_LONG_CONTEXT_MIN = 32768
DEFAULT_READY_TIMEOUT_S = 600.0
#: Seconds a case may take in all (every process, every round) before it is judged: the
#: automatic extension's budget (0: no extension).
DEFAULT_MAX_TIME_S = 30.0

#: ``parse(raw, source, config)``: ``raw`` is None when neither flag nor ini gave a value.
Parse = Callable[[Any, str, pytest.Config], Any]


def _usage(source: str, value: Any, expected: str) -> pytest.UsageError:
    return pytest.UsageError(f"{source}: invalid value {value!r}; expected {expected}")


def _int_in(lo: int, hi: int, default: int) -> Parse:
    def parse(raw: Any, source: str, config: pytest.Config) -> int:
        if raw is None:
            return default
        try:
            v = int(str(raw).strip())
        except ValueError:
            raise _usage(source, raw, f"an integer in [{lo}, {hi}]") from None
        if not lo <= v <= hi:
            raise _usage(source, raw, f"an integer in [{lo}, {hi}]")
        return v

    return parse


def _fraction(default: float) -> Parse:
    def parse(raw: Any, source: str, config: pytest.Config) -> float:
        if raw is None:
            return default
        try:
            return parse_fraction(str(raw))
        except ValueError:
            raise _usage(
                source, raw, "a fraction in (0, 1) like 0.08, or a percentage like 8%"
            ) from None

    return parse


def _flag(raw: Any, source: str, config: pytest.Config) -> bool:
    return bool(raw)


def _text(raw: Any, source: str, config: pytest.Config) -> str | None:
    return str(raw) if raw else None


def _backend(raw: Any, source: str, config: pytest.Config) -> str:
    from pytest_specperf.engines import backend_names

    name = raw or "reference"
    if name not in backend_names():
        raise _usage(source, name, f"one of: {', '.join(backend_names())}")
    return str(name)


def _baselines_dir(raw: Any, source: str, config: pytest.Config) -> Path:
    path = Path(raw) if raw else Path("baselines")
    if not path.is_absolute():
        path = config.rootpath / path
    if path.exists() and not path.is_dir():
        raise _usage(source, str(raw), "a directory (this path is a file)")
    return path


def _device_slug(raw: Any, source: str, config: pytest.Config) -> str | None:
    from pytest_specperf.telemetry.device import validate_slug

    if raw is None:
        return None
    try:
        return validate_slug(str(raw))
    except ValueError:
        raise _usage(
            source,
            raw,
            "a lowercase slug like nvidia-h200 or cpu-amd-epyc-7b13-2c "
            "([a-z0-9][a-z0-9._-]*, at most 80 characters)",
        ) from None


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


def _from_invocation_dir(raw: Any, config: pytest.Config) -> Path:
    """``raw`` as a path, relative to the directory pytest was invoked in."""
    path = Path(raw)
    return path if path.is_absolute() else Path(config.invocation_params.dir) / path


def _report_path(raw: Any, source: str, config: pytest.Config) -> Path | None:
    """A report file (JSON, Markdown), relative to the current directory."""
    if not raw:
        return None
    path = _from_invocation_dir(raw, config)
    problem = destination_problem(path)
    if problem is not None:
        raise _usage(source, raw, problem)
    return path


def _server_url(raw: Any, source: str, config: pytest.Config) -> str | None:
    if not raw:
        return None
    from pytest_specperf.server.client import check_url

    try:
        return check_url(str(raw))
    except ValueError as e:
        raise pytest.UsageError(f"{source}: {e}") from None


def _path(raw: Any, source: str, config: pytest.Config) -> Path | None:
    return Path(raw) if raw else None


def _server_args(raw: Any, source: str, config: pytest.Config) -> tuple[str, ...]:
    args = tuple(str(a) for a in (raw or ()))
    for a in args:
        if not a.strip():
            raise _usage(source, a, "a server argument such as --page-size=16 (not empty)")
    return args


def _inject(raw: Any, source: str, config: pytest.Config) -> InjectSpec | None:
    if not raw:
        return None
    try:
        return parse_inject(str(raw))
    except ValueError as e:
        raise pytest.UsageError(f"{source}: invalid value {raw!r}: {e}") from None


def _seconds_in(default: float, low: float, expected: str) -> Parse:
    """A parser of seconds in ``[low, 86400]``; ``expected`` is what the error says."""

    def parse(raw: Any, source: str, config: pytest.Config) -> float:
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not low <= value <= 86400:  # NaN fails too
            raise _usage(source, raw, expected)
        return value

    return parse


_seconds = _seconds_in(DEFAULT_READY_TIMEOUT_S, 1, "seconds in [1, 86400]")
_max_time = _seconds_in(
    DEFAULT_MAX_TIME_S, 0, "seconds in [0, 86400] (0: no automatic extension)"
)


def _history(raw: Any, source: str, config: pytest.Config) -> Path | None:
    if not raw:
        return None
    path = _from_invocation_dir(raw, config)
    if not path.is_dir():
        raise _usage(source, raw, "a directory of JSON reports (--specperf-json of earlier runs)")
    return path
def _kernel_every(raw: Any, source: str, config: pytest.Config) -> int | None:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None  # the server's default: every 16th decode step on a GPU, off on a CPU
    try:
        v = int(str(raw).strip())
    except ValueError:
        v = -1
    if not 0 <= v <= MAX_KERNEL_EVERY:
        raise _usage(source, raw, f"an integer in [0, {MAX_KERNEL_EVERY}] (0: no sampling)")
    return v


def _budget(name: str) -> Parse:
    def parse(raw: Any, source: str, config: pytest.Config) -> float | None:
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return None
        try:
            return parse_budget(name, raw)
        except ValueError:
            raise _usage(source, raw, budget_expectation(name)) from None

    return parse


_BUDGET_HELP = {
    "max_unaccounted_share": "largest share of the step outside every named phase",
    "min_active_share": "smallest share of the step the device was active (GPU, kernel "
    "samples) or the probe's thread used CPU (CPU)",
    "max_step_ms": "largest median step time in milliseconds",
    "min_accept_len": "smallest mean accepted tokens per step",
    "min_tokens_per_s": "smallest mean tokens per second of step time",
}
#: Largest accepted --specperf-baseline-max-mb, in MiB.
MAX_BASELINE_MB = 65536.0


def _baseline_max_bytes(raw: Any, source: str, config: pytest.Config) -> int | None:
    """MiB -> bytes; None leaves the limit to SPECPERF_BASELINE_MAX_MB or the default."""
    if raw is None or not str(raw).strip():
        return None
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not 0 < mb <= MAX_BASELINE_MB:  # NaN fails too
        raise _usage(source, raw, f"a size in MiB in (0, {MAX_BASELINE_MB:g}], e.g. 32")
    return max(1, int(mb * 1024 * 1024))


@dataclass(frozen=True)
class _Opt:
    flag: str
    help: str
    parse: Parse
    kind: str = "string"  # string | bool | args | ini (ini-only)
    metavar: str | None = None
    ini_default: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def ini(self) -> str:
        return self.dest.removesuffix("_arg") + "_args" if self.kind == "args" else self.dest


OPTIONS: tuple[_Opt, ...] = (
    _Opt(
        "--specperf-backend",
        "server backend: reference (embedded engine, default) or sglang",
        _backend,
        metavar="NAME",
    ),
    _Opt(
        "--specperf-baselines",
        "baseline directory (default: baselines/ at the rootdir)",
        _baselines_dir,
        metavar="DIR",
    ),
    _Opt(
        "--specperf-baseline-max-mb",
        "largest baseline file read or written, in MiB (default 8, or "
        "SPECPERF_BASELINE_MAX_MB); a larger file is refused before it is parsed",
        _baseline_max_bytes,
        metavar="MIB",
    ),
    _Opt(
        "--specperf-update-baselines",
        "record the cases measured in this run as the new baselines (other cases are kept)",
        _flag,
        kind="bool",
    ),
    _Opt(
        "--specperf-device",
        "device slug naming the baseline file (default: detected, e.g. nvidia-h200)",
        _device_slug,
        metavar="SLUG",
    ),
    _Opt(
        "--specperf-tolerance",
        "relative change a phase (judged against the rest of its step), the accept length "
        f"or the unaccounted share may show before it counts (default {DEFAULT_TOLERANCE:.0%}); "
        "0.05 or 5%",
        _fraction(DEFAULT_TOLERANCE),
        metavar="FRACTION",
    ),
    _Opt(
        "--specperf-step-tolerance",
        "relative change the step time and tokens/s (both judged against the request's KV "
        f"read time where the backend reports it) may show before they count (default "
        f"{DEFAULT_STEP_TOLERANCE:.0%}; wider: they carry the noise between processes)",
        _fraction(DEFAULT_STEP_TOLERANCE),
        metavar="FRACTION",
    ),
    _Opt(
        "--specperf-steps",
        f"measured decode steps per case (default {DEFAULT_STEPS})",
        _int_in(4, 100000, DEFAULT_STEPS),
        metavar="N",
    ),
    _Opt(
        "--specperf-warmup-steps",
        f"warm-up decode steps per case, not measured (default {DEFAULT_WARMUP_STEPS})",
        _int_in(0, 100000, DEFAULT_WARMUP_STEPS),
        metavar="N",
    ),
    _Opt(
        "--specperf-processes",
        "server processes each case is measured in (default 1); with "
        "--specperf-update-baselines, the runs recorded per case: the verdicts then know "
        "the noise between processes",
        _int_in(1, MAX_PROCESSES, 1),
        metavar="N",
    ),
    _Opt(
        "--specperf-keep-runs",
        f"runs kept per case by --specperf-update-baselines, the newest (default "
        f"{DEFAULT_KEEP_RUNS})",
        _int_in(1, MAX_RUNS, DEFAULT_KEEP_RUNS),
        metavar="K",
    ),
    _Opt(
        "--specperf-max-time",
        "seconds a case may take in all before it is judged: a case too noisy to decide "
        f"measures more rounds of its blocks until then (default {DEFAULT_MAX_TIME_S:.0f}; "
        "0: never)",
        _max_time,
        metavar="SECONDS",
    ),
    _Opt(
        "--specperf-history",
        "directory of earlier runs' JSON reports (--specperf-json, e.g. nightly): their runs "
        "of each case inform the noise between processes",
        _history,
        metavar="DIR",
    ),
    _Opt(
        "--specperf-json",
        "write a JSON report of every measured case to PATH (and a picture to PATH "
        "with the suffix .svg)",
        _report_path,
        metavar="PATH",
    ),
    _Opt(
        "--specperf-markdown",
        "write the run's summary as Markdown to PATH (also appended to $GITHUB_STEP_SUMMARY "
        "when that is set)",
        _report_path,
        metavar="PATH",
    ),
    _Opt(
        "--specperf-strict",
        "every case must be judged: NO_BASELINE, INVALID, UNSTABLE, a mapped phase that "
        "recorded no time and missing GPU telemetry fail the case",
        _flag,
        kind="bool",
    ),
    _Opt(
        "--specperf-server-url",
        "attach to a running server at URL instead of launching one",
        _server_url,
        metavar="URL",
    ),
    _Opt(
        "--specperf-run-dir",
        "step-record directory of an attached server (default: from its /server_info)",
        _path,
        metavar="DIR",
    ),
    _Opt(
        "--specperf-model",
        "model: an SGLang model path or id, or a reference-engine config (tiny, medium)",
        _text,
        metavar="MODEL",
    ),
    _Opt("--specperf-draft-model", "SGLang draft model path or id", _text, metavar="MODEL"),
    _Opt(
        "--specperf-inject",
        "canary: make phases slower, e.g. verify=1.10 or host_stall=5 (ms, lands in "
        "unaccounted); injected runs are labelled and never recorded as baselines; an "
        "attached server takes it through the control file in its run directory",
        _inject,
        metavar="PHASE=FACTOR[,...]",
    ),
    _Opt(
        "--specperf-nvtx",
        "emit an NVTX range per phase and per step in the server (for Nsight Systems: "
        "nsys profile ... pytest perf_tests --specperf-nvtx)",
        _flag,
        kind="bool",
    ),
    _Opt(
        "--specperf-profile-on-regression",
        "re-run a regressed case under the PyTorch profiler and save the trace beside the "
        "reports (the failure message names the file)",
        _flag,
        kind="bool",
    ),
    _Opt(
        "--specperf-server-arg",
        "extra server argument, passed through as is (repeatable), e.g. "
        "--specperf-server-arg=--speculative-num-draft-tokens=16",
        _server_args,
        kind="args",
        metavar="ARG",
    ),
    _Opt(
        "--specperf-long-context-min",
        "cases with a context length at or above this get the long_context marker",
        _int_in(1, 10**9, DEFAULT_LONG_CONTEXT_MIN),
        kind="ini",
        ini_default=str(DEFAULT_LONG_CONTEXT_MIN),
    ),
    _Opt(
        "--specperf-kernel-every",
        "profile the kernels of every N-th decode step in the server (torch.profiler/kineto; "
        "CUPTI on a GPU) for the device's active time per phase and the top kernels; 0: off "
        "(default: 16 on a GPU, off on a CPU, where N > 0 samples torch CPU ops)",
        _kernel_every,
        metavar="N",
    ),
    *(
        _Opt(
            "--specperf-" + name.replace("_", "-"),
            f"budget: {_BUDGET_HELP[name]} ({budget_expectation(name)}); a case beyond it "
            "fails whatever its baseline says (the marker keyword of the same name wins)",
            _budget(name),
            metavar="LIMIT",
        )
        for name in BUDGETS
    ),
    _Opt(
        "--specperf-ready-timeout",
        "seconds a launched server may take to answer /health_generate (default "
        f"{DEFAULT_READY_TIMEOUT_S:.0f})",
        _seconds,
        metavar="SECONDS",
    ),
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("specperf", "speculative-decoding performance (pytest-specperf)")
    for o in OPTIONS:
        cli_help = o.help.replace("%", "%%")  # argparse formats help with %
        if o.kind == "ini":
            parser.addini(o.ini, o.help, default=o.ini_default)
        elif o.kind == "bool":
            group.addoption(o.flag, action="store_true", default=None, dest=o.dest, help=cli_help)
            parser.addini(o.ini, o.help, type="bool", default=False)
        elif o.kind == "args":
            group.addoption(
                o.flag, action="append", default=None, dest=o.dest, metavar=o.metavar, help=cli_help
            )
            parser.addini(o.ini, o.help + " (ini: one per line)", type="linelist", default=[])
        else:
            group.addoption(
                o.flag, action="store", default=None, dest=o.dest, metavar=o.metavar, help=cli_help
            )
            parser.addini(o.ini, o.help, default=None)


def _raw(config: pytest.Config, o: _Opt) -> tuple[Any, str]:
    """The option's value and where it came from (the flag or the ini name)."""
    if o.kind != "ini":
        cli = config.getoption(o.dest)
        if cli is not None:
            return cli, o.flag
    return config.getini(o.ini), f"ini option {o.ini}"


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


#: Option dest -> ``Settings`` field, where the two names differ.
_FIELD = {
    "specperf_baselines": "baselines_dir",
    "specperf_baseline_max_mb": "baseline_max_bytes",
    "specperf_device": "device_slug",
    "specperf_json": "json_path",
    "specperf_markdown": "markdown_path",
    "specperf_server_arg": "server_args",
    "specperf_ready_timeout": "ready_timeout_s",
    "specperf_max_time": "max_time_s",
    "specperf_history": "history_dir",
}


def _check_combinations(s: Settings, sources: dict[str, str]) -> None:
    """Options that are valid alone but not together."""
    if s.run_dir is not None and not s.server_url:
        raise pytest.UsageError(
            f"{sources['run_dir']} applies only with --specperf-server-url (attach mode)"
        )
    if s.server_url and (s.server_args or s.model or s.draft_model or s.nvtx):
        raise pytest.UsageError(
            "--specperf-server-url attaches to a running server; --specperf-model, "
            "--specperf-draft-model, --specperf-server-arg and --specperf-nvtx only apply "
            "when the plugin launches the server: drop them or drop --specperf-server-url "
            "(for NVTX ranges in your own server, set SPECPERF_NVTX=1 in its environment)"
        )
    if s.inject is not None and s.update_baselines:
        raise pytest.UsageError(
            f"{sources['inject']} cannot be combined with --specperf-update-baselines: an "
            "injected slowdown must never become a baseline; drop one of the two"
        )
    if s.processes > 1 and s.server_url:
        raise pytest.UsageError(
            f"{sources['processes']} {s.processes} needs servers launched by the plugin; "
            "with --specperf-server-url there is one server: drop one of the two"
        )
    if s.kernel_every is not None and s.server_url:
        raise pytest.UsageError(
            f"{sources['kernel_every']} applies when the plugin launches the server; with "
            "--specperf-server-url, set SPECPERF_KERNEL_EVERY in the server's environment"
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


def load_settings(config: pytest.Config) -> Settings:
    """Validate every option; raise ``pytest.UsageError`` on the first bad one."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for o in OPTIONS:
        raw, source = _raw(config, o)
        name = _FIELD.get(o.dest, o.dest.removeprefix("specperf_"))
        values[name] = o.parse(raw, source, config)
        sources[name] = source
    settings = Settings(**values)
    _check_combinations(settings, sources)
    _check_junitxml(config)
    return settings
