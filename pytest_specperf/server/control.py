"""Canary injection in a running server, switched through its run directory's control file.

In attach mode the plugin cannot set ``SPECPERF_INJECT`` in the server's environment; it
writes the spec to the control file (``probe.inject.CONTROL_FILE``) instead, which the
server's probe looks at once every ``CONTROL_EVERY_STEPS`` steps. To know the switch has
happened before anything is measured, the plugin then runs a short unmeasured request of
more steps than that and checks the ``inject`` label of its last step record. The file
is removed again at the end of the session, the same way, so that the next session (an
A/A repetition of ``specperf calibrate``, say) starts from the server's own state.
"""

from __future__ import annotations

from pytest_specperf.judging.samples import KVLayout
from pytest_specperf.probe.inject import (
    CONTROL_EVERY_STEPS,
    CONTROL_FILE,
    INJECT_ERROR_LABEL,
    INJECT_LABEL,
    InjectSpec,
    remove_control,
    write_control,
)
from pytest_specperf.server.client import ServerHTTPError, ServerUnreachable
from pytest_specperf.server.decoder import CaseSpec, Decoder, MeasurementError, Pace
from pytest_specperf.server.model_server import ModelServer

#: Context length of the requests that let the probe see a new control file.
SYNC_CONTEXT = 256
#: Deadline of those requests, in seconds (short requests; the server may be cold).
SYNC_DEADLINE_S = 30.0


class ControlError(RuntimeError):
    """The server's injection could not be switched; the message says why."""


def take_control(server: ModelServer, spec: InjectSpec | None) -> bool:
    """Put an attached server under ``spec`` (None: no injection) for this session.

    Returns whether the plugin now holds the control file (and must :func:`release` it).
    Without a spec and without a control file left by an interrupted session there is
    nothing to do: the server keeps the injection of its own environment, if any.
    """
    if spec is None:
        if remove_control(server.run_dir):  # left by a session that was killed
            _sync(server, None)
        return False
    try:
        write_control(server.run_dir, spec)
    except OSError as e:
        raise ControlError(
            f"cannot write {server.run_dir / CONTROL_FILE} ({e.strerror or e}): --specperf-inject "
            "with --specperf-attach needs write access to the server's run directory"
        ) from None
    try:
        _sync(server, str(spec))
    except BaseException:
        remove_control(server.run_dir)  # not confirmed: leave the server as it was
        raise
    return True


def release(server: ModelServer) -> None:
    """Remove the control file and let the probe see it gone (the server's own state)."""
    if remove_control(server.run_dir):
        _sync(server, None)


def _sync(server: ModelServer, expect: str | None) -> None:
    """Run more steps than the probe's control period, so that it has seen the file; with
    ``expect`` (a spec, or "" for none), check that the last step ran under it."""
    steps = CONTROL_EVERY_STEPS + 1
    case = CaseSpec(SYNC_CONTEXT, 1, steps, 0, KVLayout("contiguous", 0.0), "sync")
    decoder = Decoder(server, lambda done, total, note: None, pace=Pace(floor_s=SYNC_DEADLINE_S))
    try:
        records = decoder.run_steps(case, steps)
    except (MeasurementError, ServerHTTPError, ServerUnreachable) as e:
        raise ControlError(f"switching the injection: {e}") from None
    finally:
        decoder.close()
    if expect is None:
        return
    labels = records[-1].labels
    refused = labels.get(INJECT_ERROR_LABEL)
    if refused:
        raise ControlError(f"the server's probe refused {CONTROL_FILE}: {refused}")
    if labels.get(INJECT_LABEL, "") != expect:
        raise ControlError(
            f"the server's probe did not apply {CONTROL_FILE} ({expect or 'none'}) within "
            f"{len(records)} steps: its records say inject={labels.get(INJECT_LABEL) or 'none'} "
            "(is the server's pytest-specperf older than this one?)"
        )
