"""Whether a canary was caught: an injected slowdown that no gate named fails the run.

A canary (``--specperf-inject``) exists to prove that the gate catches what it injects; a
run in which it passes (SAME, FASTER, UNSTABLE or NO_BASELINE on the injected metric) has
proved the opposite, and must not exit 0. Pure: the injection and the names of the
metrics judged SLOWER in the run's cases.
"""

from __future__ import annotations

from collections.abc import Iterable

from pytest_specperf.judging.metrics import STEP, TOKENS_PER_S
from pytest_specperf.probe.inject import HOST_STALL, WAIT_SUFFIX, InjectSpec
from pytest_specperf.probe.phases import UNACCOUNTED


def expected_names(spec: InjectSpec) -> list[tuple[str, frozenset[str]]]:
    """Per injected part (``verify=1.1``), the metrics any of which catches it: its phase;
    the step or tokens/s for ``all=`` (every phase keeps its share); ``unaccounted`` for a
    host stall; the phase for a sleep inside it (its wall time grows)."""
    every = spec.uniform
    parts: list[tuple[str, frozenset[str]]] = []
    if every is not None:
        parts.append((f"all={every:g}", frozenset({STEP, TOKENS_PER_S})))
    else:
        parts += [(f"{p}={f:g}", frozenset({p})) for p, f in sorted(spec.factors.items())]
    parts += [
        (f"{p}{WAIT_SUFFIX}={ms:g}", frozenset({p})) for p, ms in sorted(spec.waits_ms.items())
    ]
    if spec.host_stall_ms:
        parts.append((f"{HOST_STALL}={spec.host_stall_ms:g}", frozenset({UNACCOUNTED})))
    return parts


def canary_missed(
    spec: InjectSpec, slower: Iterable[str], *, cases: int, no_baseline: int = 0
) -> str | None:
    """``canary not detected: verify=1.1 was injected and no gate named verify`` when a
    part of the injection was named by no SLOWER metric of any case (``slower``: the
    metrics judged SLOWER, over every case of the run); None when every part was caught.
    ``cases``: how many cases were measured (none: nothing could catch it), of which
    ``no_baseline`` had no baseline to be compared with."""
    named = set(slower)
    missed = [(label, names) for label, names in expected_names(spec) if not names & named]
    if not missed:
        return None
    what = ", ".join(label for label, _ in missed)
    gates = " or ".join(sorted({n for _, names in missed for n in names}))
    text = f"canary not detected: {what} was injected and no gate named {gates}"
    if cases == 0:
        return text + " (no case was measured)"
    if no_baseline == cases:
        return text + (
            " (no case had a baseline to compare with: record them first, without the "
            "canary, with --specperf-update-baselines)"
        )
    return text + (
        " (the run fails whatever the verdicts: a canary that passes proves the gate blind "
        "here; on a shared or busy machine it comes out UNSTABLE: run canaries on a "
        "dedicated runner)"
    )
