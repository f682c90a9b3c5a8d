"""A canary that no gate names fails the run (``judging.canary``), whatever the verdicts."""

from __future__ import annotations

import pytest

from pytest_specperf.judging.canary import canary_missed, expected_names
from pytest_specperf.probe.inject import parse_inject


def test_a_phase_canary_is_caught_only_by_its_phase() -> None:
    spec = parse_inject("verify=1.10")
    assert canary_missed(spec, ["verify"], cases=3) is None
    missed = canary_missed(spec, ["draft", "step"], cases=3)
    assert missed is not None
    assert missed.startswith("canary not detected: verify=1.1 was injected and no gate named verify")
    assert "dedicated runner" in missed


@pytest.mark.parametrize(
    ("inject", "caught_by", "not_by"),
    [
        ("all=1.10", "step", "verify"),
        ("all=1.10", "tokens_per_s", "draft"),
        ("host_stall=5", "unaccounted", "verify"),
        ("verify_wait=20", "verify", "unaccounted"),
    ],
)
def test_each_kind_of_canary_names_its_metric(inject: str, caught_by: str, not_by: str) -> None:
    spec = parse_inject(inject)
    assert canary_missed(spec, [caught_by], cases=1) is None
    assert canary_missed(spec, [not_by], cases=1) is not None


def test_every_part_of_a_combined_canary_must_be_named() -> None:
    spec = parse_inject("verify=1.1,draft=1.2,host_stall=5")
    assert [label for label, _ in expected_names(spec)] == ["draft=1.2", "verify=1.1", "host_stall=5"]
    missed = canary_missed(spec, ["verify", "unaccounted"], cases=2)
    assert missed is not None and missed.startswith(
        "canary not detected: draft=1.2 was injected and no gate named draft"
    )


def test_without_cases_or_baselines_it_says_why() -> None:
    spec = parse_inject("verify=1.1")
    assert "(no case was measured)" in (canary_missed(spec, [], cases=0) or "")
    no_base = canary_missed(spec, [], cases=2, no_baseline=2) or ""
    assert "no case had a baseline" in no_base and "--specperf-update-baselines" in no_base
