"""Kernel sampling: ``torch.profiler`` (kineto, CUPTI on a GPU) over every Nth decode step.

On a sampled step the probe starts the profiler before the step's clock starts, writes a
``specperf.step`` annotation around the step and a ``specperf.<phase>`` annotation around
each phase, and stops the profiler after the step's clock stopped. The trace is exported
(Chrome JSON, a temporary file) and read by :mod:`.kineto` into a
:class:`~pytest_specperf.probe.kernels.KernelSample` attached to that step's record.

Cost: starting and stopping the profiler and reading the trace happen outside the step's
timing, between steps; on the sampled step itself every op and launch is recorded by the
profiler (about a microsecond each), and stopping it waits for the device. The first
start initialises kineto (CUPTI on a GPU) and takes much longer; it falls on the first
sampled step, which is in the warm-up request. A profiler that someone else runs (the
``/specperf/profile`` endpoint, ``--specperf-profile-on-regression``) is never disturbed:
steps are not sampled while it runs. Any failure turns sampling off for the process
with one log line; the probe and the server carry on.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any

from pytest_specperf.probe.kernels import ANNOTATION_PREFIX, KernelSample
from pytest_specperf.probe.kineto import parse_trace

log = logging.getLogger(__name__)


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

    def due(self, step_no: int) -> bool:
        return self.every > 0 and self.disabled is None and step_no % self.every == 0

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
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="specperf-kernels-")
        path = os.path.join(self._dir, "step.json")
        prof.export_chrome_trace(path)
        try:
            with open(path, encoding="utf-8") as fh:
                trace = json.load(fh)
        finally:
            os.unlink(path)
        samples = parse_trace(trace).samples(self.source)
        return samples[-1] if samples else None
