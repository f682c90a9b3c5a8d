"""The one phase vocabulary shared by every backend (DESIGN.md section 4)."""

from __future__ import annotations

from typing import Final

INGEST: Final = "ingest"
SCHEDULE: Final = "schedule"
LAUNCH: Final = "launch"
DRAFT: Final = "draft"
BUILD_VERIFY_INPUT: Final = "build_verify_input"
PREPARE_FOR_VERIFY: Final = "prepare_for_verify"
VERIFY: Final = "verify"
ACCEPT: Final = "accept"
KV_COMMIT: Final = "kv_commit"
POSTPROCESS: Final = "postprocess"
OUTPUT: Final = "output"
UNACCOUNTED: Final = "unaccounted"

#: Named phases of one decode step, in the order they run. ``ingest``, ``launch``,
#: ``postprocess`` and ``output`` are a serving scheduler's own host work around the
#: speculative step (SGLang: taking in requests, running the batch around the worker
#: call, processing the result, streaming output); the embedded engine has none (0).
PHASES: Final[tuple[str, ...]] = (
    INGEST,
    SCHEDULE,
    LAUNCH,
    DRAFT,
    BUILD_VERIFY_INPUT,
    PREPARE_FOR_VERIFY,
    VERIFY,
    ACCEPT,
    KV_COMMIT,
    POSTPROCESS,
    OUTPUT,
)

#: The scheduler's host phases (added in pytest-specperf's issue 29): baselines stored
#: before them lack them, and still load (a missing one reads as not measured).
HOST_PHASES: Final[tuple[str, ...]] = (INGEST, LAUNCH, POSTPROCESS, OUTPUT)

#: Phases a serving scheduler runs outside the step method (SGLang: in its event loop).
SCHEDULER_PHASES: Final[tuple[str, ...]] = (INGEST, SCHEDULE, LAUNCH, POSTPROCESS, OUTPUT)

#: The phases every stored baseline has.
CORE_PHASES: Final[tuple[str, ...]] = tuple(p for p in PHASES if p not in HOST_PHASES)

#: Everything a report can show per phase: the named phases plus the remainder.
ALL_PHASES: Final[tuple[str, ...]] = (*PHASES, UNACCOUNTED)


def check_phase(name: str) -> str:
    """Return ``name`` if it is a named phase, else raise ``ValueError`` listing the valid ones."""
    if name not in PHASES:
        raise ValueError(f"unknown phase {name!r}; valid phases: {', '.join(PHASES)}")
    return name
