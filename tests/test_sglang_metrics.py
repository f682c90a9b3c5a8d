"""Unit tests of the /metrics parser and the cross-check against our step records."""

from __future__ import annotations

import math

import pytest

from pytest_specperf.engines.sglang.metrics import (
    FORWARD_SECONDS,
    GRAPH_PASSES,
    MetricsParseError,
    cross_check,
    forward_time_mismatch,
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
        rank: int = 0, device: bool = True, draft: dict[str, GraphCount] | None = None,
        algorithm: str = "EAGLE3", kv_commit_ms: float = 0.5) -> StepRecord:
    dev = {"draft": 1_000_000, "verify": int(verify_ms * 1e6),
           "kv_commit": int(kv_commit_ms * 1e6)}
    runner = "DecodeCudaGraphRunner" if graph else "EagerRunner"
    graphs = {runner: GraphCount(1, 0) if graph else GraphCount(0, 1)}
    graphs.update(draft if draft is not None else
                  {"EAGLEDraftCudaGraphRunner[draft]": GraphCount(1, 0)})
    return StepRecord(
        step=step, wall_ns=step, mode="decode", rids=["r"], context_len=100, batch_size=1,
        accepted_tokens=3, step_ns=int(step_ms * 1e6), host_ns={"verify": 1000},
        unaccounted_ns=0, device_ns=dev if device else None,
        device_step_ns=int(step_ms * 1e6) if device else None,
        graphs=graphs, rank=rank, labels={"speculative_algorithm": algorithm},
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


EAGER_DRAFT_PATHS = {
    # EAGLEWorkerV2 whose draft graph could not run: draft_forward, counted once
    "eagle-draft": {"EagleDraftWorker.draft_forward[draft]": GraphCount(0, 1),
                    "EAGLEDraftExtendCudaGraphRunner[draft]": GraphCount(1, 0)},
    # draft extend run eagerly: SGLang files it under 'extend'
    "eagle-draft-extend": {"EAGLEDraftCudaGraphRunner[draft]": GraphCount(1, 0),
                           "EagerRunner[draft]": GraphCount(0, 1)},
    # multi-layer EAGLE without draft-extend graphs: one eager forward per MTP layer
    "multi-layer": {"EagerRunner[draft]": GraphCount(0, 3)},
}


@pytest.mark.parametrize("path", sorted(EAGER_DRAFT_PATHS))
def test_unit_cross_check_eager_draft_paths_are_not_false_disagreements(path: str) -> None:
    """SGLang times an eager draft extend as 'extend' (a prefill category) and the eager
    EAGLE draft's sampling not at all: our draft+kv_commit device time is then larger than
    its decode-category total by construction. That is said once, not reported as a
    disagreement (nor as an occupancy one)."""
    before = parse_prometheus(text(0, 0, 0.0, 0.0, 0.0))
    records = [rec(i, draft=EAGER_DRAFT_PATHS[path]) for i in range(10)]
    # target verify 80 ms; the eager draft work (15 ms) landed in 'extend' with the prefill
    after = parse_prometheus(text(10, 0, 0.080, 0.2 + 0.015, 40.0))
    lines = cross_check(before, after, records, wall_s=0.1)
    assert len(lines) == 1, lines
    assert lines[0].startswith("forward GPU time and occupancy not compared: 10 of 10 decode "
                               "steps ran draft forwards eagerly")
    assert "'extend' (a prefill category)" in lines[0]
    assert not any("SGLang measured" in x or "occupancy: SGLang's gauge" in x for x in lines)


def test_unit_cross_check_graph_steps_still_disagree_when_they_do() -> None:
    """The same numbers with every forward replayed from graphs: a real disagreement."""
    before = parse_prometheus(text(0, 0, 0.0, 0.0, 0.0))
    after = parse_prometheus(text(10, 0, 0.080, 0.215, 95.0))
    lines = cross_check(before, after, [rec(i) for i in range(10)], wall_s=0.1)
    assert any(x.startswith("forward GPU time: SGLang measured 80.0 ms") for x in lines), lines


def test_unit_cross_check_dflash_compares_draft_and_verify_only() -> None:
    """DFlash drafts in TARGET_VERIFY mode (timed as target_verify graph or eager), and its
    kv_commit projects hidden states outside any timed forward: compared without it."""
    before = parse_prometheus(text(0, 0, 0.0, 0.0, 0.0))
    records = [rec(i, algorithm="DFLASH", kv_commit_ms=3.0,
                   draft={"EagerRunner[draft]": GraphCount(0, 1)}) for i in range(10)]
    after = parse_prometheus(text(10, 0, 0.090, 0.2, 90.0))  # draft 1 ms + verify 8 ms
    assert cross_check(before, after, records, wall_s=0.1) == []
    with_kv = [rec(i, algorithm="EAGLE3", kv_commit_ms=3.0) for i in range(10)]
    assert any("draft+verify+kv_commit device time is 120.0 ms" in x
               for x in cross_check(before, after, with_kv, wall_s=0.1))


def test_unit_forward_time_mismatch_names_the_eager_counters() -> None:
    assert forward_time_mismatch(rec(0)) is None
    why = forward_time_mismatch(rec(0, draft=EAGER_DRAFT_PATHS["eagle-draft"]))
    assert why is not None and "EagleDraftWorker.draft_forward[draft]" in why
    assert forward_time_mismatch(rec(0, algorithm="DFLASH",
                                     draft=EAGER_DRAFT_PATHS["multi-layer"])) is None
