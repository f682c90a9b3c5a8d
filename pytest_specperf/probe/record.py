"""One record per decode step, as written by the sink and read by the plugin."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytest_specperf.probe.kernels import KernelSample

#: Bumped when a field changes meaning; readers refuse newer versions.
#: 2: thread CPU time per phase and step (``cpu_ns``, ``step_cpu_ns``), kernel samples.
RECORD_VERSION = 2
#: Versions the reader understands (a version 1 record has no CPU times, no kernels).
READABLE_RECORD_VERSIONS = (1, 2)


@dataclass
class GraphCount:
    """CUDA-graph replays, eager forwards and captures of one runner within one step.

    A capture (a shape seen for the first time: warm-up, capture, one run) is neither a
    replay nor an eager forward; a measured step that captures was not warmed up."""

    replay: int = 0
    eager: int = 0
    capture: int = 0


@dataclass
class StepRecord:
    """Timings of one decode step of one batch, on one rank.

    Host times are ``perf_counter_ns`` differences. Device times are CUDA-event
    intervals on the forward stream (``None`` on a CPU). Phase times are exclusive:
    a phase nested in another is subtracted from the outer one, so that the phases
    and ``unaccounted_ns`` add up to ``step_ns``. ``cpu_ns`` is the CPU time of the
    probe's thread in each phase (``thread_time_ns``, exclusive in the same way) and
    ``step_cpu_ns`` over the whole step: wall minus CPU time is time the thread waited
    (``None`` in version 1 records); ``step_runq_ns`` is the part of that wait the thread
    was runnable but had no CPU (a busy machine; Linux schedstat, else None), and
    ``step_slices`` how many times it got a CPU during the step (schedstat's timeslices:
    each ends a wait; 0: the step ran through). ``kernels``
    is set on sampled steps only. ``device_gap_ns`` (GPU, SGLang) is the device's idle time
    between the previous step's forward (its step method's call) and this step's: CUDA
    events on the stream current at both calls; None where not measured.
    """

    step: int
    wall_ns: int
    mode: str
    rids: list[str]
    context_len: int
    batch_size: int
    accepted_tokens: int
    step_ns: int
    host_ns: dict[str, int]
    unaccounted_ns: int
    device_ns: dict[str, int] | None = None
    device_step_ns: int | None = None
    graphs: dict[str, GraphCount] = field(default_factory=dict)
    rank: int = 0
    pid: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    cpu_ns: dict[str, int] | None = None
    step_cpu_ns: int | None = None
    step_runq_ns: int | None = None
    step_slices: int | None = None
    kernels: KernelSample | None = None
    device_gap_ns: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "v": RECORD_VERSION,
            "step": self.step,
            "wall_ns": self.wall_ns,
            "mode": self.mode,
            "rids": self.rids,
            "context_len": self.context_len,
            "batch_size": self.batch_size,
            "accepted_tokens": self.accepted_tokens,
            "step_ns": self.step_ns,
            "host_ns": self.host_ns,
            "unaccounted_ns": self.unaccounted_ns,
            "device_ns": self.device_ns,
            "device_step_ns": self.device_step_ns,
            "graphs": {k: _graph_json(g) for k, g in self.graphs.items()},
            "rank": self.rank,
            "pid": self.pid,
            "labels": self.labels,
            "cpu_ns": self.cpu_ns,
            "step_cpu_ns": self.step_cpu_ns,
            "step_runq_ns": self.step_runq_ns,
            "step_slices": self.step_slices,
            "kernels": self.kernels.to_json() if self.kernels is not None else None,
            "device_gap_ns": self.device_gap_ns,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRecord:
        version = data.get("v")
        if version not in READABLE_RECORD_VERSIONS:
            raise ValueError(
                f"step record version {version!r} is not supported (this plugin reads "
                f"{', '.join(map(str, READABLE_RECORD_VERSIONS))}); the server and the plugin "
                "come from different pytest-specperf versions"
            )
        graphs = {str(k): GraphCount(*(int(x) for x in v[:3])) for k, v in data["graphs"].items()}
        device = data.get("device_ns")
        return cls(
            step=int(data["step"]),
            wall_ns=int(data["wall_ns"]),
            mode=str(data["mode"]),
            rids=[str(r) for r in data["rids"]],
            context_len=int(data["context_len"]),
            batch_size=int(data["batch_size"]),
            accepted_tokens=int(data["accepted_tokens"]),
            step_ns=int(data["step_ns"]),
            host_ns={str(k): int(v) for k, v in data["host_ns"].items()},
            unaccounted_ns=int(data["unaccounted_ns"]),
            device_ns=None if device is None else {str(k): int(v) for k, v in device.items()},
            device_step_ns=(
                None if data.get("device_step_ns") is None else int(data["device_step_ns"])
            ),
            graphs=graphs,
            rank=int(data.get("rank", 0)),
            pid=int(data.get("pid", 0)),
            labels={str(k): str(v) for k, v in data.get("labels", {}).items()},
            **_v2_fields(data),
        )


def _graph_json(g: GraphCount) -> list[int]:
    """``[replay, eager]``, plus ``capture`` when there was one (older readers take the
    first two entries)."""
    return [g.replay, g.eager, g.capture] if g.capture else [g.replay, g.eager]


def _v2_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The fields version 2 added (absent, hence None, in a version 1 record)."""
    cpu = data.get("cpu_ns")
    step_cpu = data.get("step_cpu_ns")
    runq = data.get("step_runq_ns")
    slices = data.get("step_slices")
    kernels = data.get("kernels")
    gap = data.get("device_gap_ns")
    return {
        "device_gap_ns": None if gap is None else int(gap),
        "cpu_ns": None if cpu is None else {str(k): int(v) for k, v in cpu.items()},
        "step_cpu_ns": None if step_cpu is None else int(step_cpu),
        "step_runq_ns": None if runq is None else int(runq),
        "step_slices": None if slices is None else int(slices),
        "kernels": None if kernels is None else KernelSample.from_json(kernels),
    }
