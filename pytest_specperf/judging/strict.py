"""Strict runs (``--specperf-strict``): why a judged case does not count as judged.

A case counts as judged when its verdict was decided against a baseline (``SAME``,
``FASTER`` or ``SLOWER``), every default gate was judged (a case its baseline marks
``not_gated``, bimodal, counts only once the team accepts the mark in the file), and the
measurement behind it is whole: every phase the backend maps recorded time, every hook
target it requires timed at least one call during the measured window (``silent_targets``:
a target that never fired while another hook of its phase did leaves the phase non-zero
but its code untimed), and a GPU run has its telemetry. ``unjudged`` lists what is
missing; the plugin fails such a case under ``--specperf-strict`` and counts it out of
the summary's "judged N of M cases".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pytest_specperf.judging.judge import CaseOutcome
from pytest_specperf.judging.metrics import STEP
from pytest_specperf.judging.verdict import Verdict
from pytest_specperf.probe.phases import HOST_PHASES, PHASES

#: Verdicts that decide a case; every other verdict leaves it unjudged.
DECIDED = (Verdict.SAME, Verdict.FASTER, Verdict.SLOWER)


@dataclass(frozen=True)
class Unjudged:
    """One reason a case was not judged: ``label`` for the summary, ``detail`` for the
    failure message."""

    label: str
    detail: str


def silent_phases(outcome: CaseOutcome, mapped: Iterable[str]) -> list[str]:
    """Mapped phases that are zero in every measured step (their hooks did not fire)."""
    run = outcome.run
    out = []
    for p in PHASES:
        if p not in mapped:
            continue
        samples = run.samples.get(p)
        if samples is None and p in HOST_PHASES and run.samples.get(STEP):
            out.append(p)  # a scheduler host phase gets samples only where some step timed it
        elif samples and not any(samples):
            out.append(p)
    return out


def silent_targets(calls: Mapping[tuple[str, str], int]) -> list[tuple[str, str]]:
    """The ``(target, phase)`` pairs of ``calls`` (each required hook target, its phase,
    and the calls it timed during the measured window) that timed none, in target order."""
    return sorted(key for key, n in calls.items() if n <= 0)


def _silent_targets_problem(calls: Mapping[tuple[str, str], int], steps: int) -> Unjudged | None:
    silent = silent_targets(calls)
    if not silent:
        return None
    named = "; ".join(f"{target} ({phase})" for target, phase in silent)
    short = ", ".join(".".join(target.split(".")[-2:]) for target, _ in silent)
    return Unjudged(
        f"hook target(s) never fired: {short}",
        f"hook target(s) installed and required by the phase map timed 0 calls during the "
        f"measured window ({steps} steps): {named}. The code they time did not run, or runs "
        "under another name in this SGLang: run `specperf sglang-check` to see what the step "
        "calls instead, and map it (or mark the entry `may_not_fire: true` or `role: disabled` "
        "in your SPECPERF_PHASE_MAP if this configuration never takes that path)",
    )


def _verdict_problem(outcome: CaseOutcome) -> Unjudged | None:
    v = outcome.verdict.verdict
    if v in DECIDED:
        return None
    reasons = "; ".join(outcome.verdict.reasons)
    return Unjudged(v.value, f"{v.value}: {reasons}" if reasons else v.value)


def unjudged(
    outcome: CaseOutcome,
    *,
    mapped: Iterable[str] | None,
    gpu_run: bool,
    recording: bool = False,
    telemetry_note: str | None = None,
    target_calls: Mapping[tuple[str, str], int] | None = None,
) -> tuple[Unjudged, ...]:
    """Why ``outcome`` does not count as judged; empty when it does.

    ``mapped``: the phases the backend maps (None: it cannot say, nothing is checked).
    ``gpu_run``: a CUDA run, which must have telemetry (``telemetry_note`` says why there
    was none, when no sampler ran). ``target_calls``: each required hook target, its
    phase, and the calls it timed during the measured window (None: the backend does not
    count them, nothing is checked). ``recording``: an update run, where the case is
    recorded rather than compared, so only the measurement is checked.
    """
    out: list[Unjudged] = []
    if not recording:
        problem = _verdict_problem(outcome)
        if problem is not None:
            out.append(problem)
        mark = outcome.baseline.not_gated if outcome.baseline is not None else None
        if mark is not None and not mark.accepted:
            gates = ", ".join(sorted(mark.gates))
            out.append(
                Unjudged(
                    f"not gated: {gates}",
                    f"{gates} not gated: {mark.reason}; set not_gated.accepted: true for "
                    f"this case in {outcome.baseline_path} to accept it (docs/statistics.md)",
                )
            )
    silent = silent_phases(outcome, mapped) if mapped is not None else []
    if silent:
        out.append(
            Unjudged(
                f"no time recorded for {', '.join(silent)}",
                f"phase(s) {', '.join(silent)} mapped by the backend recorded 0 ms in all "
                f"{outcome.run.steps} steps: their hooks did not fire (check the server's "
                "hook report and phase map)",
            )
        )
    if target_calls is not None:
        problem = _silent_targets_problem(target_calls, outcome.run.steps)
        if problem is not None:
            out.append(problem)
    t = outcome.run.telemetry
    if gpu_run and (t is None or not t.available):
        reason = (t.reason if t is not None else telemetry_note) or "no telemetry was sampled"
        reason = reason.removeprefix("telemetry unavailable: ")
        out.append(
            Unjudged(
                "telemetry unavailable",
                f"telemetry unavailable on a GPU run: {reason} (NVML: pip install "
                "nvidia-ml-py, the plugin's gpu extra)",
            )
        )
    return tuple(out)
