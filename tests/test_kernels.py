"""Device activity per phase from kineto traces: interval unions, attribution, top kernels.

Two kinds of trace, and which is which:

* a **real** kineto trace, recorded in the test by ``torch.profiler`` on the CPU (CPU
  ops; the same Chrome export and the same reader as on a GPU);
* ``tests/data/kineto_cuda_step.json``, **hand-made** in the shape of a CUDA trace
  (``cuda_runtime`` launches, kernels, a memcpy, a memset, correlation ids): no GPU was
  available to record one. Replace it with a recorded one when a GPU is (``gpu-check``
  leaves one in ``OUT/traces/cuda-small.json.gz``);
* ``TWO_STEPS`` below, a smaller hand-made CUDA-shaped trace over two steps, for the
  totals over several steps that the GPU check reports.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_specperf.probe import StepProbe
from pytest_specperf.probe.kernel_sampler import KernelSampler
from pytest_specperf.probe.kernels import (
    ANNOTATION_PREFIX,
    STEP_ANNOTATION,
    STEP_KEY,
    Activity,
    KernelSample,
    KernelTotal,
    PhaseKernels,
    PhaseTotals,
    Window,
    attribute,
    owner,
    summarize_step,
    top_kernels,
    union_ns,
)
from pytest_specperf.probe.kineto import device_event_count, parse_events, parse_trace
from pytest_specperf.probe.phases import UNACCOUNTED

CUDA_TRACE = Path(__file__).parent / "data" / "kineto_cuda_step.json"
US = 1000  # ns


@pytest.mark.parametrize(
    ("intervals", "total"),
    [
        ([], 0),
        ([(0, 10)], 10),
        ([(0, 10), (20, 30)], 20),  # disjoint
        ([(0, 10), (5, 15)], 15),  # overlapping (two streams)
        ([(0, 100), (10, 20), (30, 40)], 100),  # nested (a CPU op inside another)
        ([(20, 30), (0, 10), (10, 20)], 30),  # touching, out of order
        ([(5, 5), (7, 3)], 0),  # empty and inverted intervals count nothing
    ],
)
def test_union_counts_overlaps_once(intervals, total):
    assert union_ns(intervals) == total


def test_owner_is_the_innermost_window():
    verify = Window("verify", 100, 200)
    prepare = Window("prepare_for_verify", 120, 140)
    assert owner([verify, prepare], 130) == "prepare_for_verify"
    assert owner([verify, prepare], 150) == "verify"
    assert owner([verify, prepare], 99) is None


def test_launches_outside_every_phase_are_unaccounted_and_outside_the_step_dropped():
    step = Window(STEP_KEY, 0, 1000)
    phases = [Window("verify", 100, 500)]
    acts = [
        Activity("k1", 150, 250, launch_ns=120),
        Activity("k2", 600, 700, launch_ns=550),
        Activity("k3", 1100, 1200, launch_ns=1050),  # launched after the step
    ]
    by = attribute(acts, phases, step)
    assert [a.name for a in by["verify"]] == ["k1"]
    assert [a.name for a in by[UNACCOUNTED]] == ["k2"]
    assert sum(map(len, by.values())) == 2


def test_top_kernels_sum_calls_and_time_per_name():
    acts = [Activity("a", 0, 10, 0), Activity("b", 0, 30, 0), Activity("a", 20, 45, 0)]
    assert top_kernels(acts) == (KernelTotal("a", 2, 35), KernelTotal("b", 1, 30))
    assert top_kernels(acts, 1) == (KernelTotal("a", 2, 35),)


def test_sample_round_trips_through_json():
    sample = summarize_step(
        [Activity("k", 10, 20, 12)], [Window("draft", 5, 30)], Window(STEP_KEY, 0, 40), "cuda"
    )
    again = KernelSample.from_json(json.loads(json.dumps(sample.to_json())))
    assert again == sample
    assert again.phases["draft"] == PhaseKernels(10, (KernelTotal("k", 1, 10),))
    with pytest.raises(ValueError, match="source 'tpu'"):
        KernelSample.from_json({"source": "tpu", "phases": {}})


# -- the hand-made CUDA-shaped trace (tests/data) -------------------------------------------
def test_cuda_shaped_trace_gives_each_phase_the_union_of_what_it_launched():
    parsed = parse_trace(json.loads(CUDA_TRACE.read_text()))
    assert parsed.source == "cuda"
    (sample,) = parsed.samples()
    assert sample.source == "cuda"
    # draft: a graph replay's two kernels, linked to the one cudaGraphLaunch
    assert sample.active_ns("draft") == 100 * US
    assert sample.active_ns("prepare_for_verify") == 5 * US  # a memset
    # verify: two kernels overlapping by 20 us on two streams (130 us), a DtoH copy
    # (10 us), a kernel linked to its aten op by External id only (10 us)
    assert sample.active_ns("verify") == 150 * US
    top = sample.phases["verify"].top
    assert top[0] == KernelTotal("flash_fwd_splitkv_kernel", 1, 100 * US)
    assert {t.name for t in top} == {
        "flash_fwd_splitkv_kernel",
        "flash_fwd_splitkv_combine_kernel",
        "Memcpy DtoH (Device -> Pinned)",
        "copy_kernel",
    }
    # launched between verify and accept: GPU work outside the mapped phases
    assert sample.active_ns(UNACCOUNTED) == 80 * US
    assert sample.phases[UNACCOUNTED].top[0].name == "unmapped_kv_append_kernel"
    # not counted: the kernel launched before the step, the other thread's kernel
    names = {t.name for p in sample.phases.values() for t in p.top}
    assert "warmup_kernel" not in names and "side_thread_kernel" not in names
    assert sample.active_ns(STEP_KEY) == (100 + 5 + 150 + 80) * US
    assert "accept" not in sample.phases  # its window launched nothing


def _x(cat: str, name: str, ts: float, dur: float, *, tid: int = 1, **args: Any) -> dict[str, Any]:
    pid = 0 if cat == "kernel" else 1
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": pid,
        "tid": tid,
        "args": args,
    }


# Step 0: a draft graph replay, two verify kernels that overlap, a kernel launched between
# phases, a kernel whose launch is not in the trace. Step 1: one verify kernel.
TWO_STEPS = {"traceEvents": [
    _x("user_annotation", "specperf.step", 0, 100),
    _x("user_annotation", "specperf.draft", 5, 20),
    _x("cuda_runtime", "cudaGraphLaunch", 10, 2, correlation=1),
    _x("user_annotation", "specperf.verify", 30, 50),
    _x("cuda_runtime", "cudaLaunchKernel", 35, 1, correlation=2),
    _x("cuda_runtime", "cudaLaunchKernel", 40, 1, correlation=3),
    _x("cuda_runtime", "cudaLaunchKernel", 90, 1, correlation=4),
    _x("kernel", "draft_gemm", 15, 10, tid=7, correlation=1),
    _x("kernel", "gather", 40, 30, tid=7, correlation=2),
    _x("kernel", "attention", 60, 20, tid=7, correlation=3),
    _x("kernel", "commit", 95, 3, tid=7, correlation=4),
    _x("kernel", "orphan", 200, 5, tid=7, correlation=99),
    {"ph": "f", "cat": "ac2g", "name": "flow", "id": 2},
    _x("user_annotation", "specperf.step", 300, 100),
    _x("user_annotation", "specperf.verify", 310, 50),
    _x("cuda_runtime", "cudaLaunchKernel", 320, 1, correlation=5),
    _x("kernel", "attention", 330, 40, tid=7, correlation=5),
]}  # fmt: skip


def test_kernels_are_attributed_to_the_phase_that_launched_them():
    first, second = parse_trace(TWO_STEPS).samples()
    # the graph replay's kernel carries the correlation of its cudaGraphLaunch
    assert first.phases["draft"].top == (KernelTotal("draft_gemm", 1, 10 * US),)
    assert {t.name for t in first.phases["verify"].top} == {"gather", "attention"}
    assert first.phases[UNACCOUNTED].top == (KernelTotal("commit", 1, 3 * US),)  # between phases
    names = {t.name for s in (first, second) for p in s.phases.values() for t in p.top}
    assert "orphan" not in names  # its launch is not in the trace: no phase, no step
    assert second.phases.keys() == {"verify", STEP_KEY}


def test_phase_totals_sum_and_union_over_the_steps():
    totals = parse_trace(TWO_STEPS).totals()
    verify = totals["verify"]
    assert (verify.ops, verify.kernel_ns) == (3, (30 + 20 + 40) * US)
    assert verify.active_ns == (40 + 40) * US  # 40..80 us (the kernels overlap), 330..370 us
    assert verify.top == (KernelTotal("attention", 2, 60 * US), KernelTotal("gather", 1, 30 * US))
    assert totals["draft"] == PhaseTotals(
        1, 10 * US, 10 * US, (KernelTotal("draft_gemm", 1, 10 * US),)
    )
    assert totals[UNACCOUNTED].ops == 1
    assert totals[STEP_KEY].ops == 5 and totals[STEP_KEY].active_ns == (10 + 40 + 3 + 40) * US
    assert parse_trace(TWO_STEPS).totals(top=1)["verify"].top == verify.top[:1]
    assert totals["verify"].to_json()["top"][0] == {
        "name": "attention",
        "calls": 2,
        "total_ns": 60 * US,
    }


# -- a real kineto trace, recorded here on the CPU -------------------------------------------
def _record_cpu_profile():
    torch = pytest.importorskip("torch")
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(256, 256)
    with profile(activities=[ProfilerActivity.CPU]) as prof, record_function(STEP_ANNOTATION):
        with record_function(ANNOTATION_PREFIX + "draft"):
            for _ in range(3):
                x @ x
        with record_function(ANNOTATION_PREFIX + "verify"):
            time.sleep(0.005)  # a wait: no op runs
            torch.relu(x @ x)
        x + 1  # outside every phase
    return prof


def _record_cpu_trace(tmp_path: Path) -> dict:
    path = tmp_path / "trace.json"
    _record_cpu_profile().export_chrome_trace(str(path))
    return json.loads(path.read_text())


def test_recorded_cpu_trace_attributes_ops_to_their_phase(tmp_path):
    trace = _record_cpu_trace(tmp_path)
    # the format the attribution relies on: record_function ranges are user annotations
    cats = {
        e["name"]: e.get("cat")
        for e in trace["traceEvents"]
        if str(e.get("name", "")).startswith(ANNOTATION_PREFIX)
    }
    assert cats == dict.fromkeys(
        [STEP_ANNOTATION, "specperf.draft", "specperf.verify"], "user_annotation"
    )
    parsed = parse_trace(trace)
    assert parsed.source == "cpu" and len(parsed.steps) == 1 and parsed.cuda == ()
    windows = {w.key: w for w in parsed.phases}
    (sample,) = parsed.samples()
    draft = sample.phases["draft"]
    assert draft.top[0] == KernelTotal("aten::matmul", 3, draft.top[0].total_ns)
    # outermost ops only: aten::mm inside aten::matmul is not counted again
    assert "aten::mm" not in {t.name for t in draft.top}
    assert draft.active_ns == draft.top[0].total_ns
    verify = sample.phases["verify"]
    span = windows["verify"].end_ns - windows["verify"].start_ns
    assert 0 < verify.active_ns < span - 4_000_000  # the 5 ms sleep is not activity
    assert {t.name for t in verify.top} == {"aten::matmul", "aten::relu"}
    assert sample.phases[UNACCOUNTED].top[0].name == "aten::add"
    assert sample.active_ns(STEP_KEY) == sum(
        sample.active_ns(k) for k in ("draft", "verify", UNACCOUNTED)
    )


def test_event_objects_and_the_exported_trace_give_the_same_sample(tmp_path):
    """The sampler's fast path (the profiler's event objects) against the Chrome export of
    the same recorded profile."""
    prof = _record_cpu_profile()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    (exported,) = parse_trace(json.loads(path.read_text())).samples()
    (live,) = parse_events(prof.profiler.kineto_results.events()).samples()
    assert live.phases.keys() == exported.phases.keys()
    for key, p in live.phases.items():
        q = exported.phases[key]
        assert abs(p.active_ns - q.active_ns) <= 10 * max(len(q.top), 1)  # us rounding
        assert [(t.name, t.calls) for t in p.top] == [(t.name, t.calls) for t in q.top]


@dataclass
class FakeKinetoEvent:
    """A profiler event object as ``kineto_results.events()`` yields them (test double)."""

    _name: str
    _type: str
    _start: int
    _end: int
    _corr: int = 0
    _linked: int = 0
    _thread: int = 1

    def name(self) -> str:
        return self._name

    def activity_type(self) -> str:
        return self._type

    def start_ns(self) -> int:
        return self._start

    def end_ns(self) -> int:
        return self._end

    def correlation_id(self) -> int:
        return self._corr

    def linked_correlation_id(self) -> int:
        return self._linked

    def start_thread_id(self) -> int:
        return self._thread


def test_event_objects_link_kernels_through_their_cpu_op_or_annotation():
    ev = [
        FakeKinetoEvent("specperf.step", "user_annotation", 0, 10_000, _corr=1),
        FakeKinetoEvent("specperf.verify", "user_annotation", 1000, 6000, _corr=2),
        FakeKinetoEvent("aten::mm", "cpu_op", 1100, 1300, _corr=3),
        FakeKinetoEvent("cudaLaunchKernel", "cuda_runtime", 1150, 1200, _corr=900, _thread=4242),
        FakeKinetoEvent("gemm_kernel", "kernel", 2000, 4000, _corr=900, _linked=3, _thread=7),
        # a graph replay inside the annotation: linked to the annotation itself
        FakeKinetoEvent("graph_kernel", "kernel", 4000, 5000, _corr=901, _linked=2, _thread=7),
        # launched by another thread's op: not the probe's
        FakeKinetoEvent("aten::add", "cpu_op", 1500, 1600, _corr=4, _thread=2),
        FakeKinetoEvent("other_kernel", "kernel", 1600, 9000, _corr=902, _linked=4, _thread=8),
        FakeKinetoEvent("copy", "gpu_memcpy", 7000, 7500, _corr=903, _linked=1, _thread=7),
    ]
    assert device_event_count(ev) == 4
    (sample,) = parse_events(ev).samples()
    assert parse_events(ev, "cuda").samples() == [sample]  # the reduced read, same sample
    assert sample.active_ns("verify") == 3000
    assert {t.name for t in sample.phases["verify"].top} == {"gemm_kernel", "graph_kernel"}
    # linked to the step's annotation, outside every phase
    assert sample.active_ns(UNACCOUNTED) == 500
    assert sample.active_ns(STEP_KEY) == 3500


def test_sampling_interval_and_cost_budget():
    s = KernelSampler(3, cuda=True)
    pattern = []
    for _ in range(12):
        due = s.due()
        pattern.append(due)
        # 10 ms steps; a sample costs 0.2 ms (2% of a step) outside the steps
        s.note_step(10_000_000, 200_000 if due else None)
    # the first sample is free; then every 3rd step while 1% of the steps' time covers it:
    # 3 steps earn 0.3 ms, a sample spends 0.2 ms
    assert pattern == [True, False, False] * 4
    expensive = KernelSampler(1, cuda=True)
    taken = 0
    for _ in range(100):
        due = expensive.due()
        taken += due
        expensive.note_step(10_000_000, 5_000_000 if due else None)  # half a step per sample
    # 1% of 100 steps of 10 ms is 10 ms: two charged samples (and the free first one)
    assert 2 <= taken <= 4
    assert not KernelSampler(0, cuda=False).due()
    with pytest.raises(ValueError, match="must be >= 0"):
        KernelSampler(-1, cuda=False)


def test_probe_samples_every_nth_decode_step_with_the_live_profiler():
    torch = pytest.importorskip("torch")
    x = torch.randn(128, 128)
    probe = StepProbe(None, kernel_every=2)
    probe.begin_step(context_len=1, batch_size=1, rids=["r"], mode="prefill")
    probe.end_step(accepted_tokens=0)
    for _ in range(4):
        probe.begin_step(context_len=1, batch_size=1, rids=["r"])
        with probe.phase("verify"):
            x @ x
        probe.end_step(accepted_tokens=1)
    recs = probe.take_completed()
    assert [r.kernels is not None for r in recs] == [False, True, False, True, False]
    sample = recs[1].kernels
    assert sample is not None and sample.source == "cpu"
    assert sample.phases["verify"].top[0].name == "aten::matmul"
    assert 0 < sample.active_ns("verify") <= recs[1].host_ns["verify"]
    assert sample.cost_ns > 0
