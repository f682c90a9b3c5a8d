"""Activity verdicts in words with numbers (pure: recorded figures in, lines out)."""

from __future__ import annotations

import pytest

from pytest_specperf.judging.bottleneck import StepFigures, activity_lines, classify

# The incident's shape on a GPU: a 192 ms step, verify's CUDA-event span 190 ms, but the
# device worked 4 ms of it; tensor 0%, DRAM 2%.
HOST = {"draft": 0.5, "verify": 190.0, "accept": 0.5}
DEVICE = {"draft": 0.4, "verify": 190.0, "accept": 0.4}


def gpu(active: dict[str, float], **kw) -> StepFigures:
    base = dict(
        step_ms=192.0, host_ms=HOST, device_ms=DEVICE, unaccounted_ms=1.0,
        dram_util_pct=2.0, tensor_util_pct=0.0, active_ms=active, active_source="device",
    )  # fmt: skip
    base.update(kw)
    return StepFigures(**base)


def test_gpu_idle_inside_verify_is_said_in_words():
    f = gpu({"draft": 0.4, "verify": 4.0, "accept": 0.3, "unaccounted": 0.0, "step": 4.7})
    assert activity_lines(f) == [
        "verify: span 190.0 ms, device active 4.0 ms (2%): the GPU idled inside verify "
        "(waits, not work)"
    ]
    b = classify(f)
    # CUDA-event spans cover the step, but the device was active 2% of it
    assert b.kind == "host-bound"
    assert b.figures["device_busy_share"] > 0.99
    assert b.figures["step_active_share"] == pytest.approx(4.7 / 192)
    assert b.figures["idle_ms.verify"] == pytest.approx(186.0)
    assert b.figures["active_share.verify"] == pytest.approx(4 / 190)
    assert "device active 2% of the step (kernel samples)" in b.reasons[0]
    assert "device active 2% (kernel samples)" in b.describe()
    assert b.lines == tuple(activity_lines(f))


def test_busy_verify_with_low_dram_is_latency_bound_with_its_top_kernel():
    f = gpu(
        {"draft": 0.4, "verify": 185.0, "accept": 0.3, "unaccounted": 0.0, "step": 186.0},
        top_kernel={"verify": ("flash_fwd_splitkv_kernel", 180.0)},
    )
    assert activity_lines(f) == [
        "verify: device active 185.0 ms (97% of its 190.0 ms span), DRAM 2% of peak: "
        "latency-bound kernels (top: flash_fwd_splitkv_kernel 180.0 ms)"
    ]
    assert classify(f).kind == "latency-bound"


def test_busy_verify_reading_kv_near_peak_is_memory_bound():
    f = gpu(
        {"verify": 185.0, "step": 186.0},
        dram_util_pct=None,
        tensor_util_pct=None,
        kv_read_bytes_per_step=0.7 * 4.8e12 * 0.185,
        peak_bandwidth_bytes_per_s=4.8e12,
        context_len=46000,
    )
    lines = activity_lines(f)
    assert lines[0].endswith(": memory-bound kernels")
    assert lines[-1] == (
        "verify read the 46000-token KV at 3.36 TB/s over its device active time, "
        "70% of 4.80 TB/s peak"
    )


def test_unaccounted_with_the_device_idle_is_a_host_stall():
    f = gpu(
        {"verify": 8.0, "unaccounted": 0.5, "step": 8.5},
        step_ms=192.0,
        host_ms={"verify": 10.0},
        device_ms={"verify": 10.0},
        unaccounted_ms=180.0,
        cpu_ms={"unaccounted": 179.0},
    )
    assert activity_lines(f)[-1] == (
        "unaccounted 180.0 ms outside every phase, device idle (active 0.5 ms, 0%): host "
        "stall; host thread CPU 179.0 ms of it"
    )


def test_unaccounted_with_the_device_active_is_unmapped_gpu_work():
    f = gpu(
        {"verify": 150.0, "unaccounted": 38.0, "step": 188.0},
        host_ms={"verify": 150.0},
        device_ms={"verify": 150.0},
        unaccounted_ms=40.0,
        top_kernel={"unaccounted": ("kv_append_kernel", 30.0)},
    )
    assert activity_lines(f)[-1] == (
        "unaccounted 40.0 ms with the device active (38.0 ms, 95%): GPU work outside the "
        "mapped phases (top: kv_append_kernel 30.0 ms)"
    )


def test_gpu_without_kernel_samples_says_what_it_cannot_tell():
    f = StepFigures(step_ms=100.0, host_ms={"verify": 50.0}, device_ms={"verify": 50.0},
                    unaccounted_ms=50.0)  # fmt: skip
    (line,) = activity_lines(f)
    assert "device activity not sampled" in line and "--specperf-profile kernels=N" in line


def cpu(**kw) -> StepFigures:
    base = dict(
        step_ms=40.0, host_ms={"draft": 1.5, "verify": 37.5}, unaccounted_ms=1.0,
        cpu_ms={"draft": 1.5, "verify": 4.0, "unaccounted": 1.0, "step": 6.5},
        active_ms={"draft": 1.5, "verify": 4.0, "unaccounted": 1.0, "step": 6.5},
        active_source="cpu",
    )  # fmt: skip
    base.update(kw)
    return StepFigures(**base)


def test_cpu_thread_that_slept_inside_verify_waited():
    assert activity_lines(cpu()) == [
        "verify: span 37.5 ms, CPU 4.0 ms (11%): the thread waited inside verify (waits, "
        "not work)"
    ]
    b = classify(cpu())
    assert b.kind == "unknown" and b.host_only
    assert "CPU time 16% of it" in b.describe()


def test_cpu_busy_phase_and_host_stall():
    f = cpu(
        step_ms=60.0,
        host_ms={"draft": 2.0, "verify": 37.0},
        unaccounted_ms=21.0,
        cpu_ms={"draft": 2.0, "verify": 36.0, "unaccounted": 20.5, "step": 58.5},
        active_ms={"draft": 2.0, "verify": 36.0, "unaccounted": 20.5, "step": 58.5},
    )
    assert activity_lines(f) == [
        "verify: span 37.0 ms, CPU 36.0 ms (97%): busy on the CPU (work, not waits)",
        "unaccounted 21.0 ms outside every phase, CPU 20.5 ms (98%): host stall (work "
        "outside the mapped phases)",
    ]


def test_a_busy_machine_is_not_taken_for_a_waiting_phase():
    # under half of verify's wall time on the CPU, and the step's time off the CPU was all
    # run-queue time: the thread may have worked or waited; the line says it cannot tell
    f = cpu(
        cpu_ms={"draft": 1.5, "verify": 17.5, "unaccounted": 1.0, "step": 20.0},
        active_ms={"draft": 1.5, "verify": 17.5, "unaccounted": 1.0, "step": 20.0},
        runq_ms=20.0,
    )
    (line,) = activity_lines(f)
    assert line == (
        "verify: span 37.5 ms, CPU 17.5 ms (47%), about 20.0 ms waiting for a CPU (a busy "
        "machine): cannot tell: the machine was busy (the thread was off the CPU 20.0 ms per "
        "step, 20.0 ms of it waiting for a CPU)"
    )
    assert "waiting for a CPU 50% (a busy machine)" in classify(f).describe()


def test_on_a_busy_machine_a_phase_always_on_the_cpu_still_worked():
    # the step's time off the CPU (16 ms) was mostly run-queue time (14 ms): draft, off
    # the CPU 15 ms, cannot tell; verify, off it 1 ms (under 5% of its span), worked
    f = cpu(
        step_ms=60.0,
        host_ms={"draft": 20.0, "verify": 39.0},
        cpu_ms={"draft": 5.0, "verify": 38.0, "unaccounted": 1.0, "step": 44.0},
        active_ms={"draft": 5.0, "verify": 38.0, "unaccounted": 1.0, "step": 44.0},
        runq_ms=14.0,
    )
    draft, verify = activity_lines(f)
    assert draft.endswith("cannot tell: the machine was busy (the thread was off the CPU "
                          "16.0 ms per step, 14.0 ms of it waiting for a CPU)")  # fmt: skip
    assert verify.endswith(": busy on the CPU (work, not waits)")


def test_a_sleep_on_a_quiet_machine_reads_as_waiting_whatever_the_little_run_queue_time():
    # 33.5 ms off the CPU per step, 2 ms of it in the run queue: the rest was the sleep
    f = cpu(runq_ms=2.0)
    (line,) = activity_lines(f)
    assert line.endswith(": the thread waited inside verify (waits, not work)")


def test_small_phases_get_no_line():
    f = cpu(host_ms={"draft": 1.0, "verify": 38.0},
            cpu_ms={"draft": 0.0, "verify": 38.0, "step": 38.0},
            active_ms={"draft": 0.0, "verify": 38.0, "step": 38.0})  # fmt: skip
    assert [line.split(":")[0] for line in activity_lines(f)] == ["verify"]
