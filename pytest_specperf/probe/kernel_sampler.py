"""Kernel sampling: ``torch.profiler`` (kineto, CUPTI on a GPU) over every Nth decode step.

On a sampled step the probe starts the profiler before the step's clock starts, writes a
``specperf.step`` annotation around the step and a ``specperf.<phase>`` annotation around
each phase, and stops the profiler after the step's clock stopped. The profiler's events
are read by :mod:`.kineto` into a :class:`~pytest_specperf.probe.kernels.KernelSample`
attached to that step's record: from the event objects directly, or, when those link no
device activity to the probe's thread although the step ran kernels (a profiler whose ids
differ from the ones this reader knows), from the Chrome trace it exports.

Cost, and the budget that bounds it: starting and stopping the profiler and reading its
events happen outside the step's timing, between steps; on the sampled step itself every
op and launch is recorded by the profiler (about a microsecond each), and stopping it
waits for the device. A step is sampled when at least ``every`` decode steps passed since
the last sample **and** the sampling so far cost at most ``BUDGET_SHARE`` (1%) of the
decode steps' time so far (a credit of 1% of every step's time, spent by each sample's
measured cost): however slow the profiler is on a machine, it takes at most 1% of the
steps' time, and fewer steps are sampled. The first start initialises kineto (CUPTI on a
GPU) and takes much longer; it falls on the first decode step, in the warm-up request, and
is not charged. A profiler that someone else runs (``/specperf/profile``,
``--specperf-profile on-regression``) is never disturbed: steps are not sampled while it
runs. Any failure turns sampling off for the process with one log line; the probe and the
server carry on.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any

from pytest_specperf.probe.kernels import ANNOTATION_PREFIX, KernelSample
from pytest_specperf.probe.kineto import ParsedTrace, device_event_count, parse_events, parse_trace

log = logging.getLogger(__name__)
#: Share of the decode steps' time kernel sampling may cost (outside the steps).
BUDGET_SHARE = 0.01


class KernelSampler:
    """Profiles every ``every``-th step of one process (``every`` 0: never)."""

    def __init__(self, every: int, *, cuda: bool) -> None:
        if every < 0:
            raise ValueError(f"kernel sampling interval {every} must be >= 0 (0: off)")
        self.every = every
        self.source = "cuda" if cuda else "cpu"
        self.disabled: str | None = None
        self._prof: Any = None
        self._torch: Any = None
        self._dir: str | None = None
        self._since = 0  # decode steps since the last sample
        self._credit_ns = 0.0  # BUDGET_SHARE of the steps' time, less the samples' cost
        self._samples = 0
        self._typical_ns = 0.0  # running mean of unsampled steps (the profiler's in-step cost)

    def due(self) -> bool:
        """Whether the next decode step is sampled (interval passed, budget not spent)."""
        if self.every <= 0 or self.disabled is not None:
            return False
        if self._samples == 0:
            return True  # the first (warm-up) sample initialises the profiler
        return self._since + 1 >= self.every and self._credit_ns >= 0

    def note_step(self, step_ns: int, cost_ns: int | None) -> None:
        """Account one decode step: its time earns credit, a sample's cost spends it (the
        time outside the step, ``cost_ns``, and what the profiler added inside the step:
        its excess over the running mean of unsampled steps)."""
        self._since += 1
        if cost_ns is None:
            self._credit_ns += BUDGET_SHARE * step_ns
            old = self._typical_ns
            self._typical_ns = step_ns if not old else 0.9 * old + 0.1 * step_ns
            return
        typical = self._typical_ns or step_ns
        self._credit_ns += BUDGET_SHARE * typical
        if self._samples:  # the first sample (kineto's start-up) is not charged
            self._credit_ns -= cost_ns + max(step_ns - typical, 0.0)
        self._samples += 1
        self._since = 0

    def _disable(self, why: str) -> None:
        self.disabled = why
        self._prof = None
        log.warning("pytest-specperf: kernel sampling off: %s", why)

    def start(self) -> bool:
        """Start the profiler for one step; False when it cannot (or must not) run now."""
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile

            if torch.autograd._profiler_enabled():  # type: ignore[attr-defined]
                return False  # another profiler runs: leave it alone, skip this step
            acts = [ProfilerActivity.CPU]
            if self.source == "cuda":
                acts.append(ProfilerActivity.CUDA)
            prof = profile(activities=acts, record_shapes=False, with_stack=False)
            prof.start()
        except Exception as e:  # never take the server down
            self._disable(f"the profiler did not start: {type(e).__name__}: {e}")
            return False
        self._torch, self._prof = torch, prof
        return True

    def annotate(self, key: str) -> Any:
        """An entered ``record_function`` named ``specperf.<key>`` (close it with ``end``)."""
        rf = self._torch.autograd.profiler.record_function(ANNOTATION_PREFIX + key)
        rf.__enter__()
        return rf

    @staticmethod
    def end(annotation: Any) -> None:
        annotation.__exit__(None, None, None)

    def stop(self) -> KernelSample | None:
        """Stop the profiler and read the step's sample (None when there is none)."""
        prof, self._prof = self._prof, None
        if prof is None:
            return None
        try:
            prof.stop()
            return self._read(prof)
        except Exception as e:
            self._disable(f"the trace could not be read: {type(e).__name__}: {e}")
            return None

    def _read(self, prof: Any) -> KernelSample | None:
        events = prof.profiler.kineto_results.events()
        parsed = parse_events(events, self.source)
        if self.source == "cuda" and not parsed.cuda and device_event_count(events):
            parsed = self._exported(prof)  # device events the fast path cannot link
        samples = parsed.samples(self.source)
        return samples[-1] if samples else None

    def _exported(self, prof: Any) -> ParsedTrace:
        """The step's events through the Chrome trace the profiler exports."""
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="specperf-kernels-")
        path = os.path.join(self._dir, "step.json")
        prof.export_chrome_trace(path)
        try:
            with open(path, encoding="utf-8") as fh:
                return parse_trace(json.load(fh))
        finally:
            os.unlink(path)
