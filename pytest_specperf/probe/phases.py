"""The one phase vocabulary shared by every backend (DESIGN.md section 4)."""

from __future__ import annotations

from typing import Final

SCHEDULE: Final = "schedule"
DRAFT: Final = "draft"
BUILD_VERIFY_INPUT: Final = "build_verify_input"
PREPARE_FOR_VERIFY: Final = "prepare_for_verify"
VERIFY: Final = "verify"
ACCEPT: Final = "accept"
KV_COMMIT: Final = "kv_commit"
UNACCOUNTED: Final = "unaccounted"

#: Named phases of one decode step, in the order they run.
PHASES: Final[tuple[str, ...]] = (
    SCHEDULE,
    DRAFT,
    BUILD_VERIFY_INPUT,
    PREPARE_FOR_VERIFY,
    VERIFY,
    ACCEPT,
    KV_COMMIT,
)

#: Everything a report can show per phase: the named phases plus the remainder.
ALL_PHASES: Final[tuple[str, ...]] = (*PHASES, UNACCOUNTED)


def check_phase(name: str) -> str:
    """Return ``name`` if it is a named phase, else raise ``ValueError`` listing the valid ones."""
    if name not in PHASES:
        raise ValueError(f"unknown phase {name!r}; valid phases: {', '.join(PHASES)}")
    return name
