"""A/B in one run: the order the two sides' server processes are measured in, the
reference side as the comparison's baseline, and the per-pair figures a reviewer redoes.

A case of an A/B run is measured on a reference side A (another build, other server
arguments, or a running server) and on the build under test B, in the same sitting,
alternating server processes: ``A1 B1 B2 A2`` (more pairs: ``A3 B3 B4 A4`` ...), each
further round of the automatic extension in the mirrored order. A linear drift of the
machine over the case then adds the same to both sides' means and cancels.

The verdict is the stored-baseline verdict of ``judging.verdict`` with A's runs of this
sitting in place of a stored baseline: per judged form, the mean over blocks of the paired
log differences (the same prompts and layouts, in the same order, on both sides), each side
averaged over its processes and rounds; its noise is ``w^2 + tau^2 (1/N_B + 1/N_A)``
(``judging.noise``): the sitting term is zero because both sides share the sitting, and
``tau^2`` is estimated from the spread of the processes within each side
(``tested_evidence``), pooled with the device prior. Student's t on the Welch-Satterthwaite
degrees of freedom, at the level the run's false-alarm budget leaves the gate
(``judging.significance``: Bonferroni over tests and cases, Pocock's constant
boundary over the extension's looks, Holm over the case's gates). docs/ab.md redoes one by hand.

``pair_changes`` gives the coarser per-pair figures the JSON report keeps beside the verdict
as a cross-check (the ratio of B's to A's raw median per pair of processes, ``ab.pairs``);
they are not what is gated: with two pairs a paired t on them has one degree of freedom,
which makes any false-alarm level below a few percent undecidable.

Pure: no clocks, files or servers.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pytest_specperf.judging.baselines import (
    FINGERPRINT_KEYS,
    BaselineFile,
    CaseBaseline,
    NotGated,
    fingerprint_hash,
    fingerprint_mismatch,
    identity_of,
)
from pytest_specperf.judging.judge import HistoryRun
from pytest_specperf.judging.samples import DecodeRun
from pytest_specperf.judging.stats import Summary
from pytest_specperf.judging.verdict import CaseVerdict

#: The side letters: the reference (A) and the build under test (B).
REFERENCE, UNDER_TEST = "A", "B"


@dataclass(frozen=True)
class Slot:
    """One server process of one side: ``side`` is ``A`` or ``B``, ``index`` 0-based."""

    side: str
    index: int

    def __str__(self) -> str:
        return f"{self.side}{self.index + 1}"


def abba_order(a: int, b: int) -> tuple[Slot, ...]:
    """The first round's order over ``a`` reference and ``b`` tested processes: pairs
    ``A1 B1``, ``B2 A2``, ``A3 B3``, ... (``max(a, b, 2)`` pairs: always balanced; a side
    with fewer processes, such as one running server, takes its processes again in turn,
    measuring another round of them). ``ValueError`` for a side without processes."""
    if a < 1 or b < 1:
        raise ValueError(f"each side needs a server process, got A={a}, B={b}")
    out: list[Slot] = []
    for i in range(max(a, b, 2)):
        pair = (Slot(REFERENCE, i % a), Slot(UNDER_TEST, i % b))
        out += pair if i % 2 == 0 else pair[::-1]
    return tuple(out)


def rounds_per_look(a: int, b: int) -> int:
    """The rounds the first tested process (``B1``) measures a look over ``a`` reference
    and ``b`` tested processes (``abba_order``'s ``max(a, b, 2)`` pairs taken in turn): 2
    with one process a side (``A1 B1 B1 A1``), 1 with two."""
    return -(-max(a, b, 2) // max(1, b))


def next_round(order: Sequence[Slot]) -> tuple[Slot, ...]:
    """The order of the next round: the last one mirrored (``A1 B1 B2 A2`` ->
    ``A2 B2 B1 A1``), so that every round is balanced on its own."""
    return tuple(reversed(order))


def describe_order(order: Sequence[Slot]) -> str:
    """``A1 B1 B2 A2``."""
    return " ".join(str(s) for s in order)


def reference_baseline(base: CaseBaseline, sitting: str, tested: Mapping[str, Any],
                       not_gated: NotGated | None = None) -> CaseBaseline:  # fmt: skip
    """The reference side's runs as the comparison's baseline, stamped with this run's
    ``sitting`` (both sides share it: the noise has no sitting term) and under the tested
    side's engine fingerprint ``tested``: the two sides differ on purpose (another build,
    other server arguments), which ``engine_differences`` says. ``not_gated``: the mark of
    the device's baseline file for the case (``stored_mark``), honoured as there."""
    runs = tuple(dataclasses.replace(r, sitting=sitting) for r in base.runs)
    fp = MappingProxyType(dict(tested))
    return dataclasses.replace(
        base, runs=runs, not_gated=not_gated, fingerprint=fp, identity=identity_of(fp),
        fingerprint_hash=fingerprint_hash(fp),
    )  # fmt: skip


def tested_blocks(run: DecodeRun) -> dict[str, tuple[int, int]]:
    """Per form, the blocks and rounds of the tested process that measured the fewest
    blocks of it."""
    out: dict[str, tuple[int, int]] = {}
    for p in run.processes:
        for m, s in p.summaries.items():
            if s.blocks and (m not in out or len(s.blocks) < out[m][0]):
                out[m] = (len(s.blocks), max(1, p.rounds))
    return out


def fold_reference(base: CaseBaseline, rounds: Sequence[int],
                   tested: Mapping[str, tuple[int, int]]) -> CaseBaseline:  # fmt: skip
    """The reference side's runs (``rounds``: each one's rounds, in order) with the rounds
    of a process that measured more of them than the tested side's shortest run
    (``tested_blocks``; one running server against two tested processes: ``A1 B1 B2 A1``)
    folded onto that run's blocks (``fold_rounds``), so that they pair. Only whole rounds
    of the same blocks fold: the reference process's blocks a round must be the tested
    run's (a round adds a block where one came back short, so two processes' rounds can
    differ), and its rounds a multiple of the tested run's. Each folded run keeps its blocks
    as measured for the scatter checks (``RunRecord.measured_blocks``): a mean over rounds
    scatters less than one round, which would read as the tested side disturbed."""
    runs = []
    for r, n in zip(base.runs, [*rounds, *[1] * (len(base.runs) - len(rounds))]):
        folded = {}
        for m, b in r.blocks.items():
            blocks, their = tested.get(m, (0, 0))
            whole = n > their > 0 and n % their == 0 and len(b) * their == blocks * n
            if whole and len(b) > blocks:
                folded[m] = fold_rounds(b, blocks)
        if folded:
            measured = {m: r.blocks[m] for m in folded}
            r = dataclasses.replace(r, blocks={**r.blocks, **folded}, measured_blocks=measured)
        runs.append(r)
    return dataclasses.replace(base, runs=tuple(runs))


def fold_rounds(blocks: Sequence[float], period: int) -> tuple[float, ...]:
    """Block centers of several rounds of the same ``period`` blocks (the same prompts and
    layouts, round after round) as ``period`` blocks: each position's geometric mean over
    the rounds, the mean of the logs the noise pairs (``noise.log_rows``). Unchanged where
    they do not fold (a length that is not a larger multiple, a center <= 0)."""
    if period < 1 or len(blocks) <= period or len(blocks) % period or min(blocks) <= 0:
        return tuple(blocks)
    rounds = len(blocks) // period
    return tuple(
        math.exp(statistics.fmean(math.log(blocks[r * period + j]) for r in range(rounds)))
        for j in range(period)
    )


def stored_mark(file: BaselineFile | None, tested: Mapping[str, Any], test: str, key: str,
                reference: Mapping[str, Any] | None = None) -> NotGated | None:  # fmt: skip
    """The ``not_gated`` mark the device's baseline file holds for a case of the tested
    engine's identity (a case whose processes split beyond any tolerance, found when it
    was recorded in 2 or more processes): an A/B run splits the same way on both sides, so
    it honours the mark, and the team's acceptance in the file, as a stored-baseline run
    does. Only a recording comparable with one side (no ``fingerprint_mismatch`` with the
    ``tested`` fingerprint or the ``reference`` one) speaks for the case: a split measured
    without huge pages, in another dtype or without CUDA graphs says nothing of this run's.
    None without a file, a recording, a mark, or a comparable recording."""
    if file is None:
        return None
    try:
        found = file.lookup(identity_of(tested), test, key)
    except ValueError:  # a fingerprint without a backend has no identity
        return None
    if not isinstance(found, CaseBaseline) or found.not_gated is None:
        return None
    sides = [tested] if reference is None else [tested, reference]
    if all(fingerprint_mismatch(found.fingerprint, dict(fp)) for fp in sides):
        return None
    return found.not_gated


def tested_evidence(run: DecodeRun, fingerprint_hash: str,
                    sitting: str) -> tuple[HistoryRun, ...]:  # fmt: skip
    """The tested side's server processes as evidence of the between-process variance
    ``tau^2``, beside the reference side's runs: labelled as a group of their own
    (``<sitting> B``), so that the nested ANOVA pools the spread within each side and the
    difference between the sides (the effect under test) never counts as noise. With two
    processes per side ``tau^2`` then rests on 2 degrees of freedom plus the prior's."""
    group = f"{sitting} {UNDER_TEST}"
    return tuple(
        HistoryRun(fingerprint_hash, f"A/B tested process {i + 1}", r.summaries, sitting=group)
        for i, r in enumerate(run.processes)
    )


def as_ab_verdict(judged: CaseVerdict) -> CaseVerdict:
    """An A/B case's verdict as its lines should read it: every metric marked as judged
    between the sides (``MetricVerdict.ab_sides``: "over 2 reference and 2 tested
    processes", not A's as baseline runs and B's again as history runs)."""
    metrics = tuple(dataclasses.replace(m, ab_sides=True) for m in judged.metrics)
    return dataclasses.replace(judged, metrics=metrics)


def engine_differences(reference: Mapping[str, Any], tested: Mapping[str, Any]) -> str | None:
    """``A/B: the sides' engines differ: engine_version A '0.5.22', B '0.5.23'``, or None."""
    diff = [
        f"{k} A {reference.get(k)!r}, B {tested.get(k)!r}"
        for k in FINGERPRINT_KEYS
        if reference.get(k) != tested.get(k)
    ]
    return f"A/B: the sides' engines differ: {'; '.join(diff)}" if diff else None


def pair_changes(reference: Sequence[Mapping[str, Summary]],
                 tested: Sequence[Mapping[str, Summary]], metric: str) -> list[float]:  # fmt: skip
    """Per pair of processes ``i`` (A's i-th and B's i-th run, a side with fewer runs
    taking its runs again in turn), ``median_B / median_A - 1`` of ``metric``; empty where
    a side lacks the metric or a median is not a positive finite number."""
    if not reference or not tested:
        return []
    out: list[float] = []
    for i in range(max(len(reference), len(tested))):
        a, b = reference[i % len(reference)].get(metric), tested[i % len(tested)].get(metric)
        if a is None or b is None:
            return []
        if not (math.isfinite(a.value) and math.isfinite(b.value) and a.value > 0):
            return []
        out.append(b.value / a.value - 1.0)
    return out
