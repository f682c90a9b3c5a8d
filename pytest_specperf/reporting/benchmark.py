"""Each judged case as a pytest-benchmark result: its name, its rounds, its ``extra_info``.

pytest-benchmark times a callable in the test's own process, round after round. A decode
step is timed inside the model server instead: the probe takes ``perf_counter_ns`` around
each step and its phases (``probe/spans.py``). The bridge hands pytest-benchmark those
measured steps as its rounds: one round is one measured decode step (one iteration, in
seconds), so pytest-benchmark's ``min``, ``median``, ``mean``, ``stddev``, ``iqr`` and
``outliers`` describe the case's step times, and its ``ops`` is decode steps per second
(tokens per second is ``ops`` times the accept length, in ``extra_info``). Warm-up steps
and the dropped first step after each prefill are not among the rounds, as they are not
among the measured steps.

This half is pure (it builds what pytest-benchmark's ``Metadata`` reads); the plugin half,
``plugin.benchmark``, hands it to pytest-benchmark's own session, which writes
``--benchmark-json``, ``--benchmark-save`` and ``--benchmark-autosave`` files as usual.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pytest_specperf.judging.baselines import identity_of
from pytest_specperf.judging.judge import CaseOutcome
from pytest_specperf.judging.metrics import ACCEPT_LEN, STEP, TOKENS_PER_S
from pytest_specperf.judging.stats import stable
from pytest_specperf.judging.verdict import verdict_label
from pytest_specperf.probe.phases import ALL_PHASES
from pytest_specperf.store.report import JSON_SCHEMA_VERSION, SPECPERF_KEY, CaseRecord, strict

#: pytest-benchmark's group of our cases (its table groups by ``group``).
BENCHMARK_GROUP: Final = "specperf"
#: The timer a benchmark's ``options`` name: the probe's clock, in the server.
TIMER: Final = "perf_counter_ns in the model server (pytest-specperf probe)"
#: Fields of a report case left out of the one a benchmark carries: derived from the
#: rest, or verbose, and not needed to judge the case again or to draw its history.
_LEFT_OUT: Final = frozenset({"metrics", "bottleneck", "time_went", "cross_check", "records"})


@dataclass(frozen=True)
class BenchmarkEntry:
    """One case as pytest-benchmark's ``Metadata`` reads it from a fixture.

    ``name``/``fullname``/``group``/``param``/``params``/``extra_info`` are the fields its
    JSON holds per benchmark; ``step_seconds`` are the rounds; ``options`` what its JSON
    says about how they were taken.
    """

    name: str
    fullname: str
    param: str
    params: Mapping[str, str]
    extra_info: dict[str, Any]
    step_seconds: tuple[float, ...]
    options: Mapping[str, Any]
    group: str | None = BENCHMARK_GROUP
    has_error: bool = False
    cprofile_stats: Any = None


def case_params(key: str) -> dict[str, str]:
    """``ctx=32768 kv=contiguous bs=1`` -> ``{"ctx": "32768", "kv": "contiguous", "bs": "1"}``
    (pytest-benchmark's ``--benchmark-group-by param:ctx`` reads these)."""
    return dict(part.split("=", 1) for part in key.split() if "=" in part)


def engine_name(fingerprint: Mapping[str, Any]) -> str:
    """The engine identity of a fingerprint, e.g. ``reference tiny DFLASH`` (``?`` if none)."""
    try:
        return identity_of(fingerprint).key
    except ValueError:
        return "?"


#: What a summary keeps in a benchmark's case: the centers (the steps are in ``samples``,
#: from which ``specperf compare`` rebuilds every summary).
_SUMMARY_KEEPS: Final = ("n", "median", "mean", "center")
_SUMMARIES: Final = ("step_ms", ACCEPT_LEN, TOKENS_PER_S)
_SUMMARY_MAPS: Final = ("phases", "device_phases")


def _centers(summary: Mapping[str, Any]) -> dict[str, Any]:
    return {k: summary[k] for k in _SUMMARY_KEEPS if k in summary}


def history_case(record: CaseRecord) -> dict[str, Any]:
    """The case as a benchmark carries it: its record's JSON, less the derived fields, its
    summaries cut to their centers (``read_report`` reads it back as a ``CaseRecord``)."""
    case = {k: v for k, v in record.to_json().items() if k not in _LEFT_OUT}
    if isinstance(case.get("siblings"), list):  # the other processes' steps, as the first's
        case["siblings"] = [{k: v for k, v in s.items() if k not in _LEFT_OUT}
                            for s in case["siblings"]]  # fmt: skip
    for name in _SUMMARIES:
        case[name] = _centers(case[name])
    for name in _SUMMARY_MAPS:
        if name in case:
            case[name] = {p: _centers(s) for p, s in case[name].items()}
    return case


def extra_info(o: CaseOutcome) -> dict[str, Any]:
    """Flat figures for people and tools (step and ``<phase>_ms``, accept length and
    tokens/s: the centers over the case's server processes, as every report shows them;
    KV fragmentation, the verdict as the summary names it, engine fingerprint) and the
    whole case under ``specperf``."""
    run, now = o.run, o.now_centers
    out: dict[str, Any] = {f"{STEP}_ms": stable(now[STEP])}
    out.update({f"{p}_ms": stable(now[p]) for p in ALL_PHASES if p in now})
    out[ACCEPT_LEN] = stable(now[ACCEPT_LEN])
    out[TOKENS_PER_S] = stable(now[TOKENS_PER_S])
    out["kv_fragmentation"] = run.fragmentation
    out["verdict"] = verdict_label(o.verdict.verdict, over_budget=bool(o.over_budget),
                                   recorded=o.recorded)  # fmt: skip
    out["engine"] = engine_name(o.fingerprint)
    out["fingerprint"] = dict(o.fingerprint)
    out[SPECPERF_KEY] = history_case(CaseRecord.of(o))
    result: dict[str, Any] = strict(out)
    return result


def benchmark_entry(o: CaseOutcome) -> BenchmarkEntry:
    """The pytest-benchmark result of one judged case."""
    run = o.run
    func = o.test.rsplit("::", 1)[-1]
    return BenchmarkEntry(
        name=f"{func}[{o.key}]",
        fullname=f"{o.test}[{o.key}]",
        param=o.key,
        params=case_params(o.key),
        extra_info=extra_info(o),
        step_seconds=tuple(ms / 1e3 for ms in run.samples[STEP]),
        options={
            "disable_gc": False,
            "timer": TIMER,
            "min_rounds": run.steps,
            "max_time": None,
            "min_time": None,
            "precision": None,
            "confidence": None,
            "warmup": run.warmup_steps,
        },
    )


def run_header(header: Mapping[str, Any]) -> dict[str, Any]:
    """The ``specperf`` object at the top of a pytest-benchmark file: the report's header
    (device, backend, baselines, tolerances, server) with its schema version."""
    out: dict[str, Any] = strict({"schema_version": JSON_SCHEMA_VERSION, **header})
    return out


def machine_entries(device: Mapping[str, Any]) -> dict[str, Any]:
    """What ``machine_info`` gets: the device the cases ran on (``DeviceInfo.to_dict``:
    the GPU's name, memory, driver and compute capability, or the CPU model and cores)
    under ``specperf_device``, and on a GPU its name as ``gpu``."""
    out: dict[str, Any] = {"specperf_device": strict(dict(device))}
    if device.get("kind") == "cuda":
        out["gpu"] = device.get("name")
    return out
