"""The diagnosis of a judged case in every report: lines, failure message, JSON (no server).

Runs are built from synthetic step records through the real summarizing and judging code:
a CPU run whose verify waited, and a GPU-shaped run with kernel samples (the device times
and kernel samples are made-up figures in the shape the probe writes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specperf.judging.budgets import Budgets
from pytest_specperf.judging.diagnosis import diagnose, time_went
from pytest_specperf.judging.judge import Case, judge_case
from pytest_specperf.judging.samples import Window, build_run
from pytest_specperf.judging.verdict import Tolerances
from pytest_specperf.probe import PHASES
from pytest_specperf.probe.kernels import STEP_KEY, KernelSample, KernelTotal, PhaseKernels
from pytest_specperf.probe.layout import KVLayout
from pytest_specperf.probe.record import StepRecord
from pytest_specperf.reporting.terminal import diagnosis_lines, failure_message, top_kernels
from pytest_specperf.store.report import case_json, strict

MS = 1_000_000


def _records(
    verify_ms: float, verify_cpu_ms: float, *, gpu: bool = False, n: int = 16, draft_ms: float = 10
):
    draft = int(draft_ms * MS)
    host = {p: int(0.05 * MS) for p in PHASES} | {"draft": draft, "verify": int(verify_ms * MS)}
    cpu = {p: int(0.05 * MS) for p in PHASES} | {
        "draft": draft,
        "verify": int(verify_cpu_ms * MS),
    }
    step = sum(host.values()) + 30_000
    out = []
    for i in range(n):
        kw = {}
        if gpu:
            kw["device_ns"] = dict(host)
            kw["device_step_ns"] = step
            if i % 4 == 0:
                kw["kernels"] = _sample(verify_ms)
        out.append(
            StepRecord(
                step=i,
                wall_ns=i,
                mode="decode",
                rids=["r"],
                context_len=46000,
                batch_size=1,
                accepted_tokens=3,
                step_ns=step,
                host_ns=dict(host),
                unaccounted_ns=30_000,
                cpu_ns=dict(cpu),
                step_cpu_ns=sum(cpu.values()) + 30_000,
                **kw,
            )
        )
    return out


def _sample(verify_ms: float) -> KernelSample:
    names = [f"kernel_{i}" for i in range(7)]
    top = tuple(KernelTotal(n, 2, int((7 - i) * 0.1 * MS)) for i, n in enumerate(names))
    return KernelSample(
        "cuda",
        {
            "verify": PhaseKernels(int(2.8 * MS), top),
            "draft": PhaseKernels(9 * MS, (KernelTotal("draft_gemm", 4, 9 * MS),)),
            STEP_KEY: PhaseKernels(int(11.8 * MS)),
        },
        cost_ns=3 * MS,
    )


def _run(records):
    blocks = [i // 4 for i in range(len(records))]
    return build_run(
        records, blocks, context_len=46000, batch_size=1, layout=KVLayout("contiguous", 1.0),
        window=Window(wall_s=1.0),
    )  # fmt: skip


def _case(run, budgets=None, gates=None):
    return Case(
        nodeid="t.py::test_d[46000]", test="t.py::test_d", key="ctx=46000 kv=contiguous bs=1",
        run=run, fingerprint={"backend": "reference"}, tolerances=Tolerances(0.07, 0.25),
        gates=gates, kv_bytes_per_token=131072.0, peak_bandwidth_bytes_per_s=4.8e12,
        budgets=budgets,
    )  # fmt: skip


def test_cpu_case_says_verify_waited_and_fails_its_budget_without_a_baseline():
    run = _run(_records(verify_ms=40.0, verify_cpu_ms=4.0))
    outcome = judge_case(_case(run, Budgets(min_active_share=0.5)), None, Path("b.yaml"))
    assert outcome.verdict.verdict.value == "NO_BASELINE" and outcome.failed
    lines = diagnosis_lines(outcome)
    assert lines[0].startswith("over budget: active_share ")
    assert any(line.startswith("bottleneck: host only") for line in lines)
    assert "  verify: span 40.0 ms, CPU 4.0 ms (10%): the thread waited inside verify" in "\n".join(
        lines
    )
    message = failure_message(outcome, "b.yaml", regression=False)
    first = message.splitlines()[0]
    assert first.startswith("over budget: active_share") and "at ctx=46000 kv=contiguous" in first
    assert message.count("over budget: active_share") == 1  # not repeated below
    assert "cpu ms" in message and "waited ms" in message  # the phase table's columns
    data = json.loads(json.dumps(strict(case_json(outcome))))
    assert data["failed"] is True and data["budgets"][0]["failed"] is True
    assert data["activity"]["source"] == "cpu"
    assert data["activity"]["phases"]["verify"]["idle_ms"] == 36.0
    assert data["kernels"] is None


def test_time_went_says_whether_the_grown_phase_worked_or_waited():
    base = {
        k: v.value for k, v in _run(_records(verify_ms=20.0, verify_cpu_ms=20.0)).summaries.items()
    }
    waited = _run(_records(verify_ms=40.0, verify_cpu_ms=15.0))
    worked = _run(_records(verify_ms=40.0, verify_cpu_ms=39.5))
    assert time_went(waited, base).endswith(
        "verify took 20.00 ms (100% of the growth); verify now: the thread waited inside "
        "verify (waits, not work)"
    )
    assert time_went(worked, base).endswith("verify now: busy on the CPU (work, not waits)")


def test_time_went_never_gives_a_part_more_than_all_of_the_growth():
    """Verify grew 20 ms while draft shrank 5: the step grew 15 ms, and verify's part is
    said to be more than that, not "100%"."""
    base = {
        k: v.value for k, v in _run(_records(verify_ms=20.0, verify_cpu_ms=20.0)).summaries.items()
    }
    run = _run(_records(verify_ms=40.0, verify_cpu_ms=40.0, draft_ms=5.0))
    went = time_went(run, base)
    assert went is not None and "the step grew 15.00 ms; verify took 20.00 ms (more than " in went
    assert "100%" not in went


def test_time_went_and_the_activity_line_give_one_answer():
    # 20.5 of 40 ms on the CPU: the activity line and the sentence agree, by one rule
    base = {
        k: v.value for k, v in _run(_records(verify_ms=20.0, verify_cpu_ms=20.0)).summaries.items()
    }
    run = _run(_records(verify_ms=40.0, verify_cpu_ms=20.5))
    (verify_line,) = [x for x in diagnose(run).lines if x.startswith("verify:")]
    went = time_went(run, base)
    assert went is not None
    assert verify_line.rsplit(": ", 1)[1] == went.rsplit(" now: ", 1)[1]


def test_time_went_names_the_blamed_phase_when_another_took_more():
    """Draft is blamed (judged against the rest of its step it grew 13%) while verify took
    twice its milliseconds: the line says both, so that it does not contradict the
    headline."""
    from pytest_specperf.judging.judge import as_baseline

    base = as_baseline(_case(_run(_records(40.0, 40.0))), at="2026-12-03T14:00:00+00:00")
    now = _run(_records(46.0, 46.0, draft_ms=13.0))
    outcome = judge_case(_case(now), base, Path("b.yaml"))
    assert outcome.verdict.culprit == "draft"
    assert outcome.time_went is not None
    assert "verify took 6.00 ms (67% of the growth)" in outcome.time_went
    assert outcome.time_went.endswith(
        "; draft, which the verdict blames (against the rest of its step), took 3.00 ms "
        "(33% of the growth); draft now: busy on the CPU (work, not waits)"
    )
    head = failure_message(outcome, "b.yaml", regression=True).splitlines()[0]
    assert head.startswith("draft / rest of step ")
    # unaccounted blamed (in points of the step): not called a phase against its rest
    figures = {k: v.value for k, v in now.summaries.items()}
    base_figs = {**figures, "verify": 40.0, "step": figures["step"] - 7.0, "unaccounted": 0.01}
    line = time_went(now, base_figs, culprit="unaccounted")
    assert line is not None and "unaccounted, which the verdict blames (its share of the step)" in line
    # blamed and largest the same: one clause, as before
    alone = judge_case(_case(_run(_records(52.0, 52.0))), base, Path("b.yaml"))
    assert alone.verdict.culprit == "verify" and alone.time_went is not None
    assert "blames" not in alone.time_went


def test_a_gpu_headline_s_raw_device_ms_are_the_phase_table_s():
    """On a GPU a phase is judged on its device time and the headline's raw milliseconds
    are the device time's centers over the baseline's runs: the phase table shows those
    same centers (before, the first process's device median, now only)."""
    import dataclasses

    from pytest_specperf.judging.judge import as_baseline
    from pytest_specperf.reporting.terminal import phase_table

    runs = [_run(_records(verify_ms=v, verify_cpu_ms=0.5, gpu=True)) for v in (10.0, 12.0, 15.0)]
    stored = [as_baseline(_case(r), at="2026-12-03T14:00:00+00:00") for r in runs]
    base = dataclasses.replace(stored[0], runs=tuple(b.runs[0] for b in stored))
    now = _run(_records(verify_ms=20.0, verify_cpu_ms=0.5, gpu=True))
    outcome = judge_case(_case(now), base, Path("b.yaml"))
    (verify,) = [m for m in outcome.verdict.metrics if m.metric == "verify"]
    assert verify.basis is not None and "device" in verify.basis
    center = (10.0 * 12.0 * 15.0) ** (1 / 3)  # not the latest run's 15
    assert verify.base == pytest.approx(center, rel=1e-3)
    assert f"raw verify {verify.base:.2f} -> {verify.now:.2f} ms" in verify.describe()
    table = phase_table(outcome)
    head = table[0].split("  ")
    assert [h.strip() for h in head if h.strip()][5:7] == ["base dev ms", "now dev ms"]
    row = next(line for line in table if line.startswith("verify ")).split()
    assert row[5:7] == [f"{verify.base:.3f}", f"{verify.now:.3f}"]


def _gpu_run(draft_dev_ms: float, verify_host_ms: float):
    """A GPU-shaped run whose host spans are the phases' launches: the host waits for the
    draft's kernels inside verify (its span grows), while the device times say the draft's
    kernels took the time."""
    records = _records(verify_ms=verify_host_ms, verify_cpu_ms=0.5, gpu=True)
    for r in records:
        r.device_ns = dict(r.device_ns or {}) | {"draft": int(draft_dev_ms * MS),
                                                 "verify": 12 * MS}  # fmt: skip
    return _run(records)


def test_time_went_on_a_gpu_reads_the_device_times_the_verdict_judges():
    """On a GPU a phase is judged on its device time; "where the time went" reads the same
    times, so it names the phase whose kernels took the growth (draft, 4 ms of GPU time),
    not the one whose host span waited for them (verify), and says whether its kernels
    worked or idled by the activity lines' rule."""
    import dataclasses

    from pytest_specperf.judging.judge import as_baseline

    runs = [_gpu_run(d, v) for d, v in ((10.0, 12.0), (10.1, 12.1), (9.9, 11.9))]
    stored = [as_baseline(_case(r), at="2026-12-03T14:00:00+00:00") for r in runs]
    base = dataclasses.replace(stored[0], runs=tuple(b.runs[0] for b in stored))
    now = _gpu_run(14.0, 16.0)
    outcome = judge_case(_case(now), base, Path("b.yaml"))
    assert outcome.verdict.culprit == "draft"
    went = outcome.time_went
    assert went is not None and went.startswith("where the time went: the step grew 4.00 ms; ")
    assert "draft took 4.00 ms of GPU time (100% of the growth)" in went
    assert "verify" not in went  # its host span grew 4 ms too, waiting for the draft
    # draft's sampled kernels were active 9 of its 14 ms: work, as its activity line says
    assert went.endswith("; draft now: busy kernels (no DRAM figure to tell memory-, "
                         "compute- and latency-bound apart)")  # fmt: skip
    line = next(x for x in diagnosis_lines(outcome) if x.strip().startswith("draft: device"))
    assert "busy kernels (no DRAM figure" in line
    host = {p: v for p, v in outcome.base_centers.items() if not p.startswith("device.")}
    assert "verify took 4.00 ms" in (time_went(now, host) or "")  # the host view blames verify


def test_first_process_figures_say_so_beside_the_centers_of_several_processes():
    """With two server processes the bottleneck's figures are the first process's: its
    line says so, in the run and in the reports read back; the progress line's ms/step is
    the summary's center over the processes."""
    import dataclasses

    from pytest_specperf.plugin.fixtures import _done_text
    from pytest_specperf.reporting.view import CaseView

    first, second = (_run(_records(verify_ms=v, verify_cpu_ms=v)) for v in (20.0, 40.0))
    one = judge_case(_case(first), None, Path("b.yaml"))
    assert any(line.startswith("bottleneck: host only") for line in diagnosis_lines(one))
    assert _done_text(first).endswith("ms/step") and "processes" not in _done_text(first)
    run = dataclasses.replace(first, siblings=(second,))
    outcome = judge_case(_case(run), None, Path("b.yaml"))
    lines = diagnosis_lines(outcome)
    assert any(line.startswith("bottleneck (server process 1 of 2): host only") for line in lines)
    view = CaseView.of(outcome, baseline_file="b.yaml")
    assert view.diagnosis == tuple(lines)  # the reports read back say the same
    ab = dataclasses.replace(outcome, reference="args=--x")  # A/B: the processes are B's
    assert any(x.startswith("bottleneck (B's server process 1 of 2): ") for x in diagnosis_lines(ab))
    step = outcome.now_centers["step"]
    assert step > first.step_ms.median * 1.2  # the center is not the first process's
    assert _done_text(run) == f"16 steps, {step:.2f} ms/step, center of 2 processes"
    from pytest_specperf.reporting.terminal import phase_table

    header = phase_table(outcome)[0]
    assert "cpu ms (p1)" in header and "waited ms (p1)" in header  # the first process's
    assert "(p1)" not in phase_table(one)[0]


def test_gpu_case_has_top_kernels_in_the_failure_and_the_json():
    run = _run(_records(verify_ms=12.0, verify_cpu_ms=0.5, gpu=True))
    assert run.active_source == "device" and run.kernels is not None
    outcome = judge_case(_case(run, Budgets(max_step_ms=10.0)), None, Path("b.yaml"))
    lines = "\n".join(diagnosis_lines(outcome))
    assert "verify: span 12.0 ms, device active 2.8 ms (23%): the GPU idled inside verify" in lines
    assert "verify read the 46000-token KV at" in lines
    table = top_kernels(outcome)
    assert table[0] == "top kernels of the step (per step, 4 sampled step(s), cuda):"
    assert table[3].split()[:2] == ["draft_gemm", "draft"]  # the largest first
    assert len(table) == 3 + 5  # head, header, rule, five kernels
    message = failure_message(outcome, "b.yaml", regression=False)
    assert "top kernels of the step" in message and "active ms" in message
    data = json.loads(json.dumps(strict(case_json(outcome))))
    verify = data["kernels"]["phases"]["verify"]
    assert data["kernels"]["sampled_steps"] == 4 and data["kernels"]["cost_ms_per_sample"] == 3.0
    assert verify[0] == {"name": "kernel_0", "calls": 2.0, "total_ms": 0.7, "share": 0.7 / 12}
    assert data["activity"]["phases"]["verify"]["active_ms"] == 2.8
    assert data["bottleneck"]["lines"][:2] == [
        "draft: device active 9.0 ms (90% of its 10.0 ms span): busy kernels (no DRAM figure "
        "to tell memory-, compute- and latency-bound apart) (top: draft_gemm 9.0 ms)",
        "verify: span 12.0 ms, device active 2.8 ms (23%): the GPU idled inside verify "
        "(waits, not work)",
    ]


def test_every_number_of_a_case_comes_from_one_place():
    """A baseline of three runs that differ: the headline's raw base, the phase table's
    base, the summary's base and the JSON's centers are one number (the verdict's center
    over the runs), not the latest run's median in one place and the center in another."""
    import dataclasses

    from pytest_specperf.judging.judge import as_baseline
    from pytest_specperf.reporting.terminal import phase_table
    from pytest_specperf.reporting.view import CaseView

    runs = [_run(_records(verify_ms=v, verify_cpu_ms=v)) for v in (18.0, 20.0, 24.0)]
    stored = [as_baseline(_case(r), at="2026-12-03T14:00:00+00:00") for r in runs]
    base = dataclasses.replace(stored[0], runs=tuple(b.runs[0] for b in stored))
    now = _run(_records(verify_ms=40.0, verify_cpu_ms=39.0))
    outcome = judge_case(_case(now), base, Path("b.yaml"))
    (verify,) = [m for m in outcome.verdict.metrics if m.metric == "verify"]
    centers = outcome.base_centers
    assert centers is not None
    # the center of 18, 20 and 24 ms is neither the latest run (24) nor their mean
    assert centers["verify"] == pytest.approx((18.0 * 20.0 * 24.0) ** (1 / 3), rel=1e-3)
    assert verify.base == pytest.approx(centers["verify"])
    assert f"raw verify {verify.base:.2f} -> " in verify.describe()
    row = next(line for line in phase_table(outcome) if line.startswith("verify "))
    assert row.split()[1] == f"{centers['verify']:.3f}"
    view = CaseView.of(outcome, baseline_file="b.yaml")
    assert view.base_step_ms == pytest.approx(centers["step"])
    assert view.base_phases is not None and view.base_phases["verify"] == centers["verify"]
    assert case_json(outcome)["centers"]["base"]["verify"] == centers["verify"]
    # the headline leads with the judged quantity, in its own units
    assert verify.describe().startswith("verify / rest of step ")
