"""Unit tests of the /metrics parser and the cross-check against our step records."""

from __future__ import annotations

import math

import pytest

from pytest_specperf.engines.sglang.metrics import (
    FORWARD_SECONDS,
    GRAPH_PASSES,
    MetricsParseError,
    cross_check,
    parse_prometheus,
    scrape,
    summarize,
)
from pytest_specperf.probe.record import GraphCount, StepRecord

LABELS = 'model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"'


def text(graph: float, eager: float, verify_s: float, extend_s: float, occ: float) -> str:
    return f"""\
# HELP sglang:cuda_graph_passes_total Total number of forward passes categorized by CUDA graph.
# TYPE sglang:cuda_graph_passes_total counter
sglang:cuda_graph_passes_total{{{LABELS},mode="decode_cuda_graph"}} {graph}
sglang:cuda_graph_passes_total{{{LABELS},mode="decode_none"}} {eager}
# TYPE sglang:forward_execution_seconds_total counter
sglang:forward_execution_seconds_total{{{LABELS},category="target_verify"}} {verify_s}
sglang:forward_execution_seconds_total{{{LABELS},category="draft_extend"}} 0.0
sglang:forward_execution_seconds_total{{{LABELS},category="extend"}} {extend_s}
# TYPE sglang:fwd_occupancy gauge
sglang:fwd_occupancy{{{LABELS}}} {occ}
sglang:num_running_reqs{{{LABELS}}} 0.0
"""


def rec(step: int, *, graph: bool = True, verify_ms: float = 8.0, step_ms: float = 10.0,
        rank: int = 0, device: bool = True) -> StepRecord:
    dev = {"draft": 1_000_000, "verify": int(verify_ms * 1e6), "kv_commit": 500_000}
    runner = "DecodeCudaGraphRunner" if graph else "EagerRunner"
    return StepRecord(
        step=step, wall_ns=step, mode="decode", rids=["r"], context_len=100, batch_size=1,
        accepted_tokens=3, step_ns=int(step_ms * 1e6), host_ns={"verify": 1000},
        unaccounted_ns=0, device_ns=dev if device else None,
        device_step_ns=int(step_ms * 1e6) if device else None,
        graphs={runner: GraphCount(1, 0) if graph else GraphCount(0, 1),
                "EAGLEDraftCudaGraphRunner[draft]": GraphCount(1, 0)},
        rank=rank,
    )


def test_unit_parse_prometheus_text() -> None:
    snap = parse_prometheus(text(10, 2, 0.5, 0.25, 80.0) + 'x{a="q\\"uo\\\\te\\n"} NaN\n'
                            "y +Inf 1700000000\n")
    assert snap.total(GRAPH_PASSES) == 12
    assert snap.by_label(GRAPH_PASSES, "mode") == {"decode_cuda_graph": 10.0, "decode_none": 2.0}
    assert snap.total(FORWARD_SECONDS, category="extend") == 0.25
    assert snap.select("x")[0].label("a") == 'q"uo\\te\n'
    assert math.isnan(snap.select("x")[0].value)
    assert snap.total("y") == math.inf
    assert snap.total("absent") is None
    assert summarize(snap)["fwd_occupancy"] == 80.0


@pytest.mark.parametrize(("line", "message"), [
    ('m{a="1"', "unterminated|malformed"),
    ('m{a=1} 2', "malformed label set"),
    ("m", "has no value"),
    ("m abc", "bad value"),
    ("{a=\"1\"} 2", "no metric name"),
])
def test_unit_parse_errors(line: str, message: str) -> None:
    with pytest.raises(MetricsParseError, match=message):
        parse_prometheus(line + "\n")


def test_unit_cross_check_agreement_is_silent() -> None:
    before = parse_prometheus(text(5, 0, 0.100, 0.2, 0.0))
    records = [rec(i) for i in range(10)]  # 10 graph steps, 9.5 ms forward each
    after = parse_prometheus(text(15, 0, 0.100 + 0.095, 0.9, 95.0))
    assert cross_check(before, after, records, wall_s=0.1) == []


def test_unit_cross_check_reports_disagreements() -> None:
    before = parse_prometheus(text(0, 0, 0.0, 0.0, 0.0))
    records = [rec(i) for i in range(8)] + [rec(8, graph=False), rec(9, graph=False)]
    after = parse_prometheus(text(4, 6, 0.040, 0.5, 10.0))
    lines = cross_check(before, after, records, wall_s=0.1)
    assert len(lines) == 4, lines
    assert "CUDA-graph decode passes: SGLang counted 4" in lines[0] and "saw 8" in lines[0]
    assert "eager decode passes: SGLang counted 6" in lines[1] and "saw 2" in lines[1]
    assert "forward GPU time: SGLang measured 40.0 ms" in lines[2] and "95.0 ms" in lines[2]
    assert "forward occupancy: SGLang's gauge says 10.0%" in lines[3]


def test_unit_cross_check_flags_impossible_forward_time() -> None:
    before = parse_prometheus(text(0, 0, 0.0, 0.0, 0.0))
    after = parse_prometheus(text(10, 0, 0.5, 0.0, 50.0))  # 500 ms of forwards in 100 ms steps
    lines = cross_check(before, after, [rec(i) for i in range(10)])
    assert any("more than the 100.0 ms of device time" in x for x in lines)


def test_unit_cross_check_other_ranks_and_missing_metrics() -> None:
    empty = parse_prometheus("")
    lines = cross_check(empty, empty, [rec(0, rank=1)], wall_s=1.0)
    assert [x.split(" ")[0] for x in lines] == [GRAPH_PASSES, FORWARD_SECONDS,
                                                "sglang:fwd_occupancy"]
    no_dev = cross_check(parse_prometheus(text(0, 0, 0, 0, 0)),
                         parse_prometheus(text(1, 0, 0.01, 0, 5)),
                         [rec(0, device=False)], wall_s=1.0)
    assert no_dev == ["our records carry no device times (probe ran without CUDA events); "
                      "forward GPU time not compared"]


class FakeServerClient:
    def __init__(self, body: object) -> None:
        self.body = body

    def get(self, path: str, *, timeout: float | None = None) -> object:
        assert path == "/metrics"
        return self.body


def test_unit_scrape() -> None:
    snap = scrape(FakeServerClient(text(1, 0, 0, 0, 0)))  # type: ignore[arg-type]
    assert snap.total(GRAPH_PASSES) == 1
    with pytest.raises(MetricsParseError, match="--enable-metrics"):
        scrape(FakeServerClient({"detail": "Not Found"}))  # type: ignore[arg-type]
