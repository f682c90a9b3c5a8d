"""Environment variables read inside server processes, and the probe they configure.

The plugin passes its settings to a server it launches through the environment (the
reference server and every SGLang scheduler process read the same names). This module
is the one place that turns that environment into a probe setup; it imports only the
standard library at module level, so that SGLang's plugin entry point stays cheap to
import in processes that never measure anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_specperf.probe import NullProbe, RunDirSink, StepProbe
    from pytest_specperf.probe.inject import InjectControl
    from pytest_specperf.probe.spans import PhaseInjector

ENV_RUN_DIR = "SPECPERF_RUN_DIR"  # where the probe sink writes step records
ENV_SGLANG_PLUGIN = "SPECPERF_SGLANG_PLUGIN"  # "1": our sglang.srt.plugins entry point hooks
ENV_PHASE_MAP = "SPECPERF_PHASE_MAP"  # user phase-map extension file for SGLang forks
ENV_INJECT = "SPECPERF_INJECT"  # canary slowdowns, same syntax as --specperf-inject
ENV_NVTX = "SPECPERF_NVTX"  # "1": an NVTX range per phase (Nsight Systems)
ENV_KERNEL_EVERY = "SPECPERF_KERNEL_EVERY"  # profile every N-th decode step's kernels (0: off)

#: Kernel sampling interval on a CUDA device when none is given (every 16th decode step:
#: two sampled steps in a 32-step case). Off on a CPU unless asked for.
DEFAULT_KERNEL_EVERY_CUDA = 16
#: Largest accepted sampling interval.
MAX_KERNEL_EVERY = 1_000_000


class ProbeEnvError(ValueError):
    """The environment holds a value the probe cannot use; the message names it."""


@dataclass(frozen=True)
class ProbeSetup:
    """What a server process's probe is configured with: labels, injector, NVTX."""

    labels: Mapping[str, str] = field(default_factory=dict)
    injector: PhaseInjector | None = None
    nvtx: bool = False
    #: The injected slowdown in ``--specperf-inject`` syntax ("" when none).
    inject: str = ""
    #: Profile every N-th decode step's kernels (0: off).
    kernel_every: int = 0
    #: The run directory's control file, which switches the injection of a running server.
    control: InjectControl | None = None

    def build(
        self, sink: RunDirSink | None, *, use_cuda: bool, rank: int = 0
    ) -> StepProbe | NullProbe:
        """A probe writing to ``sink``; a no-op probe when ``sink`` is None (probe off)."""
        from pytest_specperf.probe import NullProbe, StepProbe

        if sink is None:
            return NullProbe()
        return StepProbe(
            sink,
            rank=rank,
            use_cuda=use_cuda,
            labels=dict(self.labels),
            injector=self.injector,
            nvtx=self.nvtx,
            kernel_every=self.kernel_every,
            control=self.control,
        )


def probe_setup(
    *,
    device: str,
    labels: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    run_dir: str | os.PathLike[str] | None = None,
) -> ProbeSetup:
    """Read ``SPECPERF_INJECT`` and ``SPECPERF_NVTX`` into a probe setup for ``device``.

    ``labels`` are the process's own step-record labels; an injected slowdown adds the
    ``inject`` label. With ``run_dir``, the probe also takes injections from the control
    file there (``probe.inject.InjectControl``), the environment's spec while there is
    none. ``SPECPERF_KERNEL_EVERY`` sets the kernel-sampling interval (default:
    ``DEFAULT_KERNEL_EVERY_CUDA`` on a CUDA device, off on a CPU). Raises
    :class:`ProbeEnvError` naming the variable and its value when one does not parse.
    """
    from pytest_specperf.probe.inject import INJECT_LABEL, InjectControl, Injector, parse_inject

    env = os.environ if environ is None else environ
    out = dict(labels or {})
    injector: Injector | None = None
    text = env.get(ENV_INJECT, "").strip()
    spec = None
    if text:
        try:
            spec = parse_inject(text)
        except ValueError as e:
            raise ProbeEnvError(f"{ENV_INJECT}={text!r}: {e}") from None
        injector = Injector(spec, device=device)
        text = str(spec)
        out[INJECT_LABEL] = text
    control = InjectControl(run_dir, device=device, base=spec) if run_dir is not None else None
    return ProbeSetup(
        labels=out,
        injector=injector,
        nvtx=env.get(ENV_NVTX) == "1",
        inject=text,
        kernel_every=kernel_every_from_env(env, device),
        control=control,
    )


def kernel_every_from_env(env: Mapping[str, str], device: str) -> int:
    """``SPECPERF_KERNEL_EVERY`` as an interval (0: off); the device's default when unset."""
    text = env.get(ENV_KERNEL_EVERY, "").strip()
    if not text:
        return DEFAULT_KERNEL_EVERY_CUDA if str(device).startswith("cuda") else 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_KERNEL_EVERY:
        raise ProbeEnvError(
            f"{ENV_KERNEL_EVERY}={text!r}: expected an integer in [0, {MAX_KERNEL_EVERY}] "
            "(0: no kernel sampling)"
        )
    return value


def probe_env(
    *, inject: str | None = None, nvtx: bool = False, kernel_every: int | None = None
) -> dict[str, str]:
    """The environment that configures a launched server's probe (what ``probe_setup``
    reads back): the injected slowdown, NVTX ranges, the kernel-sampling interval."""
    env: dict[str, str] = {}
    if inject:
        env[ENV_INJECT] = inject
    if nvtx:
        env[ENV_NVTX] = "1"
    if kernel_every is not None:
        env[ENV_KERNEL_EVERY] = str(kernel_every)
    return env


def run_dir_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The run directory named by ``SPECPERF_RUN_DIR`` (None when unset or empty)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_RUN_DIR) or None
