"""Command-line options, their ini twins, and validation into one ``Settings`` object.

Every option ``--specperf-X`` has an ini twin ``specperf_X``; the command line wins.
Bad values raise ``pytest.UsageError`` naming the flag, the value and what is valid.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_specperf.inject import InjectSpec, parse_inject

BACKENDS = ("reference", "sglang")
#: Chosen from ``specperf calibrate`` on the 2-core development box (README, "Calibration"):
#: the smallest tolerances with at most 1 false alarm in 20 A/A runs, with and without a
#: CPU hog. On a GPU, calibrate there and set the ini values from its sweep tables.
DEFAULT_TOLERANCE = 0.07
DEFAULT_STEP_TOLERANCE = 0.25
DEFAULT_STEPS = 32
DEFAULT_WARMUP_STEPS = 8
DEFAULT_LONG_CONTEXT_MIN = 32768
DEFAULT_READY_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class _Opt:
    flag: str
    help: str
    kind: str = "string"  # string | bool | args
    metavar: str | None = None
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


OPTIONS: tuple[_Opt, ...] = (
    _Opt(
        "--specperf-backend",
        "server backend: reference (embedded engine, default) or sglang",
        metavar="NAME",
        choices=BACKENDS,
    ),
    _Opt(
        "--specperf-baselines",
        "baseline directory (default: baselines/ at the rootdir)",
        metavar="DIR",
    ),
    _Opt(
        "--specperf-update-baselines",
        "record the cases measured in this run as the new baselines (other cases are kept)",
        kind="bool",
    ),
    _Opt(
        "--specperf-device",
        "device slug naming the baseline file (default: detected, e.g. nvidia-h200)",
        metavar="SLUG",
    ),
    _Opt(
        "--specperf-tolerance",
        "relative change a phase (judged against the rest of its step), the accept length "
        f"or the unaccounted share may show before it counts (default {DEFAULT_TOLERANCE:.0%}); "
        "0.05 or 5%",
        metavar="FRACTION",
    ),
    _Opt(
        "--specperf-step-tolerance",
        "relative change the step time (judged against the request's KV read time) and "
        f"tokens/s may show before they count (default {DEFAULT_STEP_TOLERANCE:.0%}; wider: "
        "they carry the machine's drift)",
        metavar="FRACTION",
    ),
    _Opt(
        "--specperf-steps", f"measured decode steps per case (default {DEFAULT_STEPS})", metavar="N"
    ),
    _Opt(
        "--specperf-warmup-steps",
        f"warm-up decode steps per case, not measured (default {DEFAULT_WARMUP_STEPS})",
        metavar="N",
    ),
    _Opt("--specperf-json", "write a JSON report of every measured case to PATH", metavar="PATH"),
    _Opt(
        "--specperf-server-url",
        "attach to a running server at URL instead of launching one",
        metavar="URL",
    ),
    _Opt(
        "--specperf-run-dir",
        "step-record directory of an attached server (default: from its /server_info)",
        metavar="DIR",
    ),
    _Opt(
        "--specperf-model",
        "model: an SGLang model path or id, or a reference-engine config (tiny, medium)",
        metavar="MODEL",
    ),
    _Opt("--specperf-draft-model", "SGLang draft model path or id", metavar="MODEL"),
    _Opt(
        "--specperf-inject",
        "canary: make phases slower, e.g. verify=1.10 or host_stall=5 (ms, lands in "
        "unaccounted); injected runs are labelled and never recorded as baselines",
        metavar="PHASE=FACTOR[,...]",
    ),
    _Opt(
        "--specperf-nvtx",
        "emit an NVTX range per phase and per step in the server (for Nsight Systems: "
        "nsys profile ... pytest perf_tests --specperf-nvtx)",
        kind="bool",
    ),
    _Opt(
        "--specperf-profile-on-regression",
        "re-run a regressed case under the PyTorch profiler and save the trace beside the "
        "reports (the failure message names the file)",
        kind="bool",
    ),
    _Opt(
        "--specperf-server-arg",
        "extra server argument, passed through as is (repeatable), e.g. "
        "--specperf-server-arg=--speculative-num-draft-tokens=16",
        kind="args",
        metavar="ARG",
    ),
)

#: ini-only settings: (name, help, default)
INI_ONLY: tuple[tuple[str, str, str], ...] = (
    (
        "specperf_long_context_min",
        "cases with a context length at or above this get the long_context marker",
        str(DEFAULT_LONG_CONTEXT_MIN),
    ),
    (
        "specperf_ready_timeout",
        "seconds a launched server may take to answer /health_generate",
        str(int(DEFAULT_READY_TIMEOUT_S)),
    ),
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("specperf", "speculative-decoding performance (pytest-specperf)")
    for o in OPTIONS:
        ini = o.dest
        cli_help = o.help.replace("%", "%%")  # argparse formats help with %
        if o.kind == "bool":
            group.addoption(o.flag, action="store_true", default=None, dest=ini, help=cli_help)
            parser.addini(ini, o.help, type="bool", default=False)
        elif o.kind == "args":
            group.addoption(
                o.flag, action="append", default=None, dest=ini, metavar=o.metavar, help=cli_help
            )
            parser.addini(
                ini.removesuffix("_arg") + "_args",
                o.help + " (ini: one per line)",
                type="linelist",
                default=[],
            )
        else:
            group.addoption(
                o.flag, action="store", default=None, dest=ini, metavar=o.metavar, help=cli_help
            )
            parser.addini(ini, o.help, default=None)
    for name, help_, default in INI_ONLY:
        parser.addini(name, help_, default=default)


@dataclass(frozen=True)
class Settings:
    backend: str
    baselines_dir: Path
    update_baselines: bool
    device_slug: str | None
    tolerance: float
    step_tolerance: float
    steps: int
    warmup_steps: int
    json_path: Path | None
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


def _usage(flag: str, value: Any, expected: str) -> pytest.UsageError:
    return pytest.UsageError(f"{flag}: invalid value {value!r}; expected {expected}")


def _raw(config: pytest.Config, o: _Opt) -> tuple[Any, str]:
    """The option's value and where it came from (the flag or the ini name)."""
    cli = config.getoption(o.dest)
    if cli is not None:
        return cli, o.flag
    ini = o.dest.removesuffix("_arg") + "_args" if o.kind == "args" else o.dest
    return config.getini(ini), f"ini option {ini}"


def parse_fraction(text: str) -> float:
    """``0.08``, ``8%`` -> 0.08; ValueError otherwise."""
    s = text.strip()
    value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    if not (0.0 < value < 1.0):
        raise ValueError(text)
    return value


def _int(text: Any, flag: str, lo: int, hi: int) -> int:
    try:
        v = int(str(text).strip())
    except ValueError:
        raise _usage(flag, text, f"an integer in [{lo}, {hi}]") from None
    if not lo <= v <= hi:
        raise _usage(flag, text, f"an integer in [{lo}, {hi}]")
    return v


_SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]{0,79}$")


def load_settings(config: pytest.Config) -> Settings:
    """Validate every option; raise ``pytest.UsageError`` on the first bad one."""
    by_flag = {o.flag: o for o in OPTIONS}

    def get(flag: str) -> tuple[Any, str]:
        return _raw(config, by_flag[flag])

    backend, src = get("--specperf-backend")
    backend = backend or "reference"
    if backend not in BACKENDS:
        raise _usage(src, backend, f"one of: {', '.join(BACKENDS)}")

    baselines, src = get("--specperf-baselines")
    baselines_dir = Path(baselines) if baselines else Path("baselines")
    if not baselines_dir.is_absolute():
        baselines_dir = config.rootpath / baselines_dir
    if baselines_dir.exists() and not baselines_dir.is_dir():
        raise _usage(src, str(baselines), "a directory (this path is a file)")

    update, src_update = get("--specperf-update-baselines")
    if update and os.environ.get("PYTEST_XDIST_WORKER"):
        raise pytest.UsageError(
            f"{src_update} cannot run in pytest-xdist workers: parallel writers would lose "
            "each other's cases, and parallel cases would slow each other down; run without -n"
        )

    slug, src = get("--specperf-device")
    if slug is not None and (not _SLUG.match(slug) or ".." in slug):
        raise _usage(
            src,
            slug,
            "a lowercase slug like nvidia-h200 or cpu-amd-epyc-7b13-2c "
            "([a-z0-9][a-z0-9._-]*, at most 80 characters)",
        )

    fractions = {}
    for flag, default in (
        ("--specperf-tolerance", DEFAULT_TOLERANCE),
        ("--specperf-step-tolerance", DEFAULT_STEP_TOLERANCE),
    ):
        tol_raw, src = get(flag)
        fractions[flag] = default
        if tol_raw is not None:
            try:
                fractions[flag] = parse_fraction(str(tol_raw))
            except ValueError:
                raise _usage(
                    src, tol_raw, "a fraction in (0, 1) like 0.08, or a percentage like 8%"
                ) from None
    tolerance = fractions["--specperf-tolerance"]
    step_tolerance = fractions["--specperf-step-tolerance"]

    steps_raw, src = get("--specperf-steps")
    steps = DEFAULT_STEPS if steps_raw is None else _int(steps_raw, src, 4, 100000)
    warm_raw, src = get("--specperf-warmup-steps")
    warmup = DEFAULT_WARMUP_STEPS if warm_raw is None else _int(warm_raw, src, 0, 100000)

    json_raw, src = get("--specperf-json")
    json_path = None
    if json_raw:
        json_path = Path(json_raw)
        if not json_path.is_absolute():
            json_path = Path(config.invocation_params.dir) / json_path
        if json_path.is_dir():
            raise _usage(src, json_raw, "a file path (this path is a directory)")

    url, src = get("--specperf-server-url")
    if url:
        from pytest_specperf.server.client import check_url

        try:
            url = check_url(url)
        except ValueError as e:
            raise pytest.UsageError(f"{src}: {e}") from None

    run_dir_raw, src = get("--specperf-run-dir")
    run_dir = Path(run_dir_raw) if run_dir_raw else None
    if run_dir is not None and not url:
        raise pytest.UsageError(f"{src} applies only with --specperf-server-url (attach mode)")

    model, _ = get("--specperf-model")
    draft, _ = get("--specperf-draft-model")
    args, src = get("--specperf-server-arg")
    server_args = tuple(str(a) for a in (args or ()))
    for a in server_args:
        if not a.strip():
            raise _usage(src, a, "a server argument such as --page-size=16 (not empty)")
    nvtx = bool(get("--specperf-nvtx")[0])
    if url and (server_args or model or draft or nvtx):
        raise pytest.UsageError(
            "--specperf-server-url attaches to a running server; --specperf-model, "
            "--specperf-draft-model, --specperf-server-arg and --specperf-nvtx only apply "
            "when the plugin launches the server: drop them or drop --specperf-server-url "
            "(for NVTX ranges in your own server, set SPECPERF_NVTX=1 in its environment)"
        )

    inject_raw, src = get("--specperf-inject")
    inject = None
    if inject_raw:
        try:
            inject = parse_inject(str(inject_raw))
        except ValueError as e:
            raise pytest.UsageError(f"{src}: invalid value {inject_raw!r}: {e}") from None
        if update:
            raise pytest.UsageError(
                f"{src} cannot be combined with --specperf-update-baselines: an injected "
                "slowdown must never become a baseline; drop one of the two"
            )
        if url:
            raise pytest.UsageError(
                f"{src} needs a server launched by the plugin; with --specperf-server-url, "
                "start the server with SPECPERF_INJECT set in its environment instead"
            )

    lc = config.getini("specperf_long_context_min")
    long_min = _int(lc, "ini option specperf_long_context_min", 1, 10**9)
    rt = config.getini("specperf_ready_timeout")
    try:
        ready = float(rt)
        if not 1 <= ready <= 86400:
            raise ValueError
    except ValueError:
        raise _usage("ini option specperf_ready_timeout", rt, "seconds in [1, 86400]") from None

    return Settings(
        backend=backend,
        baselines_dir=baselines_dir,
        update_baselines=bool(update),
        device_slug=slug,
        tolerance=tolerance,
        step_tolerance=step_tolerance,
        steps=steps,
        warmup_steps=warmup,
        json_path=json_path,
        server_url=url,
        run_dir=run_dir,
        model=model,
        draft_model=draft,
        server_args=server_args,
        inject=inject,
        nvtx=nvtx,
        profile_on_regression=bool(get("--specperf-profile-on-regression")[0]),
        long_context_min=long_min,
        ready_timeout_s=ready,
    )
