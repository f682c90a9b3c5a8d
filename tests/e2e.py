"""What the end-to-end plugin tests share: the options of the pytest runs they start, and
their test file of one gated case."""

from __future__ import annotations

#: Short cases (8 measured steps after 2 warm-up steps, no automatic extension: the case
#: counts its steps; tests/test_noise_e2e.py has the extension) against the ``test-box``
#: baselines, without pytest's cache, in file order.
SHORT_RUN = (
    "--specperf-steps=8,warmup=2",
    "--specperf-max-time=0",
    "--specperf-device=test-box",
    "-p",
    "no:cacheprovider",
    "-p",
    "no:randomly",
)

#: One case at ctx=2048 (as ``test_case.py``) whose only gate is ``verify``: tests move
#: verify far beyond any drift of the machine, while the other phases are left to that
#: drift (the calibration tests deal with it).
VERIFY_CASE = """
import pytest

@pytest.mark.specperf(gate=["verify"])
@pytest.mark.parametrize("context_len", [2048])
def test_decode(specperf, context_len):
    run = specperf.decode(context_len=context_len)
    assert run.steps == 8
"""


def sigint_default() -> None:
    """``preexec_fn`` of a pytest process a test interrupts with SIGINT: SIGINT back to its
    default. A shell starts background jobs with SIGINT ignored, the ignoring is inherited,
    and Python then never raises KeyboardInterrupt (the test would see no Ctrl-C at all)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (exited, not yet reaped; an orphan's reaper may be
    slow to collect it) is gone for our purposes."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def column(case: dict, metric: str) -> list:
    """A stored case's per-run list of ``metric`` as the file holds it (schema v3: a step
    part's forms in its ``phases`` row, the others under ``value``): the list itself, so
    a test can edit it in place."""
    from pytest_specperf.store.baseline_schema import ROW_OF

    row = ROW_OF.get(metric)
    if row is not None and row[0] in case.get("phases", {}):
        return case["phases"][row[0]][row[1]]
    return case["value"][metric]
