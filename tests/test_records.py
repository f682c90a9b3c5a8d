"""Records are frozen, verdicts serialize in one place, reports are read through one reader."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from pytest_specperf.engines import backend_names, get_backend
from pytest_specperf.judging.metrics import GATEABLE, REGISTRY, MetricKind, spec
from pytest_specperf.judging.samples import KVLayout, build_run
from pytest_specperf.judging.verdict import CaseVerdict, MetricVerdict, Verdict
from pytest_specperf.probe.record import StepRecord
from pytest_specperf.server.protocol import BackendUnavailable
from pytest_specperf.store.report import ReportError, read_report, strict, write_report


def _records(n: int = 12) -> list[StepRecord]:
    host = {"draft": 2_000_000, "verify": 6_000_000, "accept": 100_000}
    return [
        StepRecord(i, 0, "decode", ["r"], 1024, 1, 3, 8_200_000 + i * 1000, dict(host), 100_000)
        for i in range(n)
    ]


def test_decode_run_is_frozen() -> None:
    recs = _records()
    run = build_run(recs, [i // 4 for i in range(12)], context_len=1024, batch_size=1,
                    layout=KVLayout("contiguous", 0.0))  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.fragmentation = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError):
        run.summaries["step"] = run.summaries["verify"]  # type: ignore[index]
    assert run.steps == 12 and run.step_ms.median == pytest.approx(8.2055, abs=1e-3)
    assert run.summaries["verify/rest"].median == pytest.approx(6 / 2.1)


def test_metric_verdict_round_trips_through_json() -> None:
    mv = MetricVerdict("verify", Verdict.SLOWER, 30.0, 33.0, 0.1, 0.01, 0.07, "ms",
                       basis="against the rest of the step", raw_change=0.1, scatter_ratio=1.2)  # fmt: skip
    back = MetricVerdict.from_json(json.loads(json.dumps(mv.to_json())))
    assert back == mv
    with pytest.raises(dataclasses.FrozenInstanceError):
        mv.verdict = Verdict.SAME  # type: ignore[misc]
    assert CaseVerdict(Verdict.SLOWER, (mv,)).culprit == "verify"


def test_non_finite_numbers_are_null_and_undecided() -> None:
    mv = MetricVerdict("verify", Verdict.SLOWER, 0.0, 1.0, math.inf, math.nan, 0.07, "ms")
    d = mv.to_json()
    assert d["change"] is None and d["noise"] is None
    json.dumps(d, allow_nan=False)
    assert MetricVerdict.from_json(d).rejudged(0.07) is Verdict.UNSTABLE
    assert strict({"a": [1.0, math.inf, {"b": math.nan}]}) == {"a": [1.0, None, {"b": None}]}


def test_rejudged_is_the_rule_at_another_tolerance() -> None:
    mv = MetricVerdict.from_json({"metric": "verify", "change": 0.09, "noise": 0.01})
    assert mv.rejudged(0.05) is Verdict.SLOWER and mv.rejudged(0.10) is Verdict.SAME
    util = MetricVerdict.from_json({"metric": "util.sm", "change": -0.2, "noise": 0.0})
    assert util.rejudged(0.05) is Verdict.SLOWER  # a utilization drop: higher is better


def test_report_reader_checks_the_version(tmp_path) -> None:
    path = tmp_path / "r.json"
    write_report(path, {"schema_version": 1, "tolerance": math.inf, "cases": []})
    assert '"tolerance": null' in path.read_text()
    assert read_report(path).cases == ()
    path.write_text(json.dumps({"schema_version": 7, "cases": []}))
    with pytest.raises(ReportError, match=r"r\.json: schema_version 7 is not one"):
        read_report(path)
    path.write_text('{"schema_version": 1, "cases": [')
    with pytest.raises(ReportError, match="not JSON"):
        read_report(path)
    path.write_text("[1, 2]")
    with pytest.raises(ReportError, match="not a pytest-specperf report"):
        read_report(path)


def test_registry_covers_every_gate() -> None:
    assert "util.sm" in GATEABLE and "verify" in GATEABLE and "step" in GATEABLE
    assert spec("device.verify/rest") is REGISTRY["verify"]
    assert spec("step/ref") is REGISTRY["step"]
    assert REGISTRY["unaccounted"].kind is MetricKind.SHARE and REGISTRY["unaccounted"].in_points
    assert REGISTRY["accept_len"].center == "mean" and REGISTRY["accept_len"].higher_is_better
    assert REGISTRY["tokens_per_s"].tolerance == "step"


def test_backend_registry_binds_backends_to_their_run_dir(tmp_path) -> None:
    assert backend_names()[:2] == ("reference", "sglang")
    with pytest.raises(ValueError, match="unknown backend 'vllm'; choose one of: reference"):
        get_backend("vllm")
    b = get_backend("reference")
    with pytest.raises(BackendUnavailable, match="not bound to a run directory"):
        _ = b.run_dir
    b.bind(tmp_path)
    assert b.run_dir == tmp_path
    assert get_backend("reference") is not b  # a new, unbound backend each time
