"""Judge a measured case: assemble the judge's ``Case`` from what the test asked, the
server and the run's inputs, find its baseline, judge it, and what an update records.

No pytest here: the test's side (its node id, parameters, marker) arrives as a frozen
``CaseRequest``; a case that cannot be judged raises ``CaseRefused`` with its message.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_specperf.judging.ab import (
    as_ab_verdict,
    engine_differences,
    fold_reference,
    reference_baseline,
    stored_mark,
    tested_blocks,
    tested_evidence,
)
from pytest_specperf.judging.baselines import (
    CaseBaseline,
    CaseProblem,
    fingerprint_hash,
    identity_of,
)
from pytest_specperf.judging.budgets import Budgets
from pytest_specperf.judging.judge import (
    Case,
    CaseOutcome,
    as_baseline,
    judge_case,
    more_steps_would_decide,
    noisy_baseline_note,
    recording_refusal,
)
from pytest_specperf.judging.metrics import STEP
from pytest_specperf.judging.samples import DecodeRun
from pytest_specperf.judging.significance import Family
from pytest_specperf.judging.strict import Unjudged, unjudged
from pytest_specperf.judging.verdict import Tolerances
from pytest_specperf.run.inputs import FOREIGN_FIX, RunInputs
from pytest_specperf.run.measure import Undecided, UndecidedAB
from pytest_specperf.server.model_server import ModelServer
from pytest_specperf.store.baselines import utc_now

Found = CaseBaseline | CaseProblem | None


class CaseRefused(RuntimeError):
    """A case that must not be judged or recorded as it is; the message says why."""


@dataclass(frozen=True)
class CaseRequest:
    """What a test asks of its cases: where they come from and how they are judged."""

    nodeid: str
    #: the baseline's test key (the node id without its parametrization)
    test: str
    #: the test's other parameters, `` name=value`` each, appended to every case key
    params: str
    tolerances: Tolerances
    gates: tuple[str, ...] | None
    budgets: Budgets | None
    #: specperf tests the run judges, and looks per case (``MAX_LOOKS`` with the automatic
    #: extension, else 1): the false-alarm budget's shares (``judging.significance``)
    tests: int = 1
    looks: int = 1

    def family(self, cases: int, look: int = 1, planned: int | None = None) -> Family:
        """The false-alarm family of a case of this test that has measured ``cases``, at
        look ``look`` (the extension's looks taken, clamped to ``looks``: a side's rounds
        per process for one side; an A/B case's entries of its order); ``planned``: the
        looks the extension planned for the case from its first round (``DecodeRun.looks``,
        at most ``looks``)."""
        looks = self.looks if planned is None else max(1, min(planned, self.looks))
        look = min(max(1, look), looks)
        return Family(tests=self.tests, cases=max(1, cases), looks=looks, look=look)

    def key(self, context_len: int, layout: str, batch_size: int) -> str:
        """``ctx=<tokens> kv=<layout> bs=<batch>`` plus the test's other parameters."""
        return f"ctx={context_len} kv={layout} bs={batch_size}{self.params}"

    def keys(self, runs: list[DecodeRun]) -> list[str]:
        """Case keys of a test's runs; a repeated case gets ``#2``, ``#3``."""
        seen: dict[str, int] = {}
        keys = []
        for run in runs:
            key = self.key(run.context_len, run.kv_layout.label, run.batch_size)
            seen[key] = seen.get(key, 0) + 1
            keys.append(key if seen[key] == 1 else f"{key} #{seen[key]}")
        return keys


def _pid(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mapping(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def case_of(inputs: RunInputs, request: CaseRequest, server: ModelServer, run: DecodeRun,
            key: str, cases: int, look: int | None = None) -> Case:  # fmt: skip
    """The judge's view of one measured case (``cases``: the test's runs so far; ``look``:
    the looks taken, by default the run's rounds per process)."""
    return Case(
        nodeid=request.nodeid,
        test=request.test,
        key=key,
        run=run,
        fingerprint=server.fingerprint,
        tolerances=request.tolerances,
        gates=request.gates,
        speculative=server.speculative,
        kv_bytes_per_token=server.backend.kv_bytes_per_token(server.server_info),
        peak_bandwidth_bytes_per_s=inputs.peak_bandwidth_bytes_per_s,
        server_pid=_pid(server.server_info.get("pid")),
        history=inputs.history_of(request.test, key),
        kv_traffic=_mapping(server.server_info.get("kv_read")),
        budgets=request.budgets,
        family=request.family(cases, run.rounds if look is None else look, run.looks),
        prior=inputs.prior,
        sitting=inputs.sitting,
    )


def find_baseline(inputs: RunInputs, case: Case, shown: str) -> tuple[Found, str]:
    """The case's baseline (or the problem with it) and, when there is none, why;
    ``CaseRefused`` when the baseline file is unusable. ``shown``: the file as named."""
    if inputs.baseline_error is not None:
        raise CaseRefused(str(inputs.baseline_error))
    bf = inputs.baselines
    if bf is None:
        return None, f"no baseline file {shown}"
    if inputs.foreign is not None:  # a problem of every case: INVALID, never compared
        fix = f"this run is never judged against it: {FOREIGN_FIX}"
        return CaseProblem(bf.path, "device", case.test, case.key, inputs.foreign, fix), ""
    identity = identity_of(case.fingerprint)
    found = bf.lookup(identity, case.test, case.key)
    if found is not None:
        return found, ""
    held = ", ".join(i.key for i in bf.identities()) or "none"
    return None, (
        f"no baseline for {case.key} ({identity.key}) in {shown}; the file holds baselines "
        f"of {held[:300]}"
    )


def baseline_step_ms(inputs: RunInputs, fingerprint: Mapping[str, Any], test: str,
                     key: str) -> float | None:  # fmt: skip
    """The baseline's median step time (ms) of a case about to run, for its deadlines;
    None without a usable one (the judge reports an unusable baseline after the run)."""
    bf = inputs.baselines
    if bf is None or inputs.foreign is not None:
        return None
    try:
        found = bf.lookup(identity_of(fingerprint), test, key)
    except ValueError:
        return None
    step = found.metrics.get(STEP) if isinstance(found, CaseBaseline) else None
    if step is None or not math.isfinite(step.value) or step.value <= 0:
        return None
    return step.value


def judge(inputs: RunInputs, case: Case, shown: str, *, record: bool) -> CaseOutcome:
    """Judge one case; with ``record`` (an update), ``CaseRefused`` for a run that must
    not be recorded."""
    base, missing = find_baseline(inputs, case, shown)
    if record:
        refusal = recording_refusal(case.run, case.key)
        if refusal:
            raise CaseRefused(refusal)
    return judge_case(case, base, inputs.baseline_path, missing=missing, record=record)


def undecided(inputs: RunInputs, request: CaseRequest, server: ModelServer,
              earlier: list[DecodeRun], shown: str) -> Undecided:  # fmt: skip
    """For the automatic extension: the metrics a run leaves UNSTABLE that more rounds
    would decide, judged as at the end of the test (``earlier``: the test's runs so far).
    A pure function of the run: nothing is read while measuring. ``CaseRefused`` when
    the baseline file is unusable."""

    def of(run: DecodeRun) -> list[str]:
        key = request.keys([*earlier, run])[-1]
        case = case_of(inputs, request, server, run, key, len(earlier))
        found, _ = find_baseline(inputs, case, shown)
        return more_steps_would_decide(case, found)

    return of


@dataclass(frozen=True)
class Policy:
    """How this run judges its cases: ``record`` (an update), ``strict`` (a case that
    was not fully judged fails), and whether it runs on a CUDA device."""

    record: bool
    strict: bool
    gpu_run: bool


@dataclass(frozen=True)
class Judged:
    """One judged case: its outcome, why it does not count as judged (strict), and what
    an update records of it (with the note on a noisy recording)."""

    case: Case
    outcome: CaseOutcome
    unjudged: tuple[Unjudged, ...]
    to_record: CaseBaseline | None
    record_note: str | None
    #: why the run has no GPU telemetry, when its sampler said so
    telemetry_note: str | None


def _mapped_phases(server: ModelServer) -> frozenset[str] | None:
    mapped = getattr(server.backend, "mapped_phases", None)  # a third-party backend may lack it
    return mapped(server.server_info) if mapped is not None else None


def _target_calls(server: ModelServer) -> Mapping[tuple[str, str], int] | None:
    calls = getattr(server.backend, "target_calls", None)  # only the sglang backend counts them
    return calls(server.server_info) if calls is not None else None


def _strict_check(
    outcome: CaseOutcome,
    server: ModelServer,
    policy: Policy,
    telemetry_note: str | None,
    *,
    recording: bool,
) -> tuple[tuple[Unjudged, ...], str | None]:
    """Why ``outcome`` is not judged under ``policy.strict`` (empty otherwise), and the
    telemetry note, updated when this run's telemetry says why it is missing."""
    t = outcome.run.telemetry
    if t is not None and not t.available:
        telemetry_note = t.reason
    if not policy.strict:
        return (), telemetry_note
    problems = unjudged(
        outcome, mapped=_mapped_phases(server), gpu_run=policy.gpu_run, recording=recording,
        telemetry_note=telemetry_note, target_calls=_target_calls(server),
    )  # fmt: skip
    return problems, telemetry_note


def judge_one(inputs: RunInputs, request: CaseRequest, server: ModelServer, run: DecodeRun,
              key: str, shown: str, policy: Policy, telemetry_note: str | None,
              cases: int = 1) -> Judged:  # fmt: skip
    """Judge one measured case, check it under ``policy.strict`` and, in an update, what
    to record (stamped now). ``telemetry_note``: why telemetry was missing so far;
    ``cases``: the test's measured runs."""
    case = case_of(inputs, request, server, run, key, cases)
    outcome = judge(inputs, case, shown, record=policy.record)
    problems, telemetry_note = _strict_check(
        outcome, server, policy, telemetry_note, recording=policy.record
    )
    if problems:  # strict: an incomplete run is not recorded
        outcome = dataclasses.replace(outcome, recorded=False)
    recording = policy.record and not problems
    return Judged(
        case,
        outcome,
        problems,
        as_baseline(case, at=utc_now()) if recording else None,
        noisy_baseline_note(case) if recording else None,
        telemetry_note,
    )


# -- A/B in one run ------------------------------------------------------------------------

#: The sitting of an A/B comparison whose run has no sitting id: both sides share it.
AB_SITTING = "<this run>"


@dataclass(frozen=True)
class Reference:
    """An A/B run's reference side as the judge and the reports see it: its server (the
    first process) and what it is, as typed (``python=...``, ``args=...``, ``url=...``)."""

    server: ModelServer
    label: str

    @property
    def shown(self) -> str:
        """Where a report says the comparison came from, in place of a baseline file."""
        return f"A/B in this run against A: {self.label}"


def ab_baseline(inputs: RunInputs, request: CaseRequest, reference: Reference,
                run: DecodeRun, key: str, cases: int,
                tested: Mapping[str, Any], look: int = 1,
                tested_run: DecodeRun | None = None) -> CaseBaseline:  # fmt: skip
    """The reference side's run of a case as the comparison's baseline, stamped with
    this run's sitting (no stamp on disk: an A/B run never writes a baseline), under the
    tested side's fingerprint ``tested``, with the device's baseline file's ``not_gated``
    mark for the case, if it has one; its rounds folded onto ``tested_run``'s blocks where
    it measured more of them (``judging.ab.fold_reference``)."""
    case = case_of(inputs, request, reference.server, run, key, cases, look)
    base = as_baseline(case, at=utc_now())
    mark = stored_mark(inputs.baselines if inputs.foreign is None else None, tested,
                       request.test, key, base.fingerprint)  # fmt: skip
    if tested_run is not None:  # its rounds folded onto the tested side's blocks
        base = fold_reference(base, [p.rounds for p in run.processes], tested_blocks(tested_run))
    return reference_baseline(base, inputs.sitting or AB_SITTING, tested, mark)


def _ab_case(inputs: RunInputs, request: CaseRequest, server: ModelServer, run: DecodeRun,
             key: str, cases: int, look: int) -> Case:  # fmt: skip
    """The tested side's case, of this run's sitting, judged at look ``look`` (the looks
    taken, not its processes' rounds). Its own processes are the evidence of the
    between-process noise beside the reference side's (``judging.ab.tested_evidence``),
    and so are earlier A/B runs' tested processes (``--specperf-history``: each report a
    sitting of its own, so each adds its processes' spread, never its offset)."""
    case = case_of(inputs, request, server, run, key, cases, look)
    sitting = inputs.sitting or AB_SITTING
    history = (
        *tested_evidence(run, fingerprint_hash(case.fingerprint), sitting),
        *inputs.history_of(request.test, key, ab=True),
    )
    return dataclasses.replace(case, sitting=sitting, history=history)


def undecided_ab(inputs: RunInputs, request: CaseRequest, server: ModelServer,
                 reference: Reference, earlier: list[DecodeRun]) -> UndecidedAB:  # fmt: skip
    """For an A/B case's automatic extension: the metrics the two sides' runs so far
    leave UNSTABLE that more rounds would decide at look ``looks`` (the looks taken;
    pure, as ``undecided``)."""

    def of(a: DecodeRun, b: DecodeRun, looks: int) -> list[str]:
        key = request.keys([*earlier, b])[-1]
        base = ab_baseline(inputs, request, reference, a, key, len(earlier), server.fingerprint,
                           looks, b)  # fmt: skip
        return more_steps_would_decide(_ab_case(inputs, request, server, b, key,
                                                len(earlier), looks), base)  # fmt: skip

    return of


def judge_ab(inputs: RunInputs, request: CaseRequest, server: ModelServer, run: DecodeRun,
             reference: Reference, reference_run: DecodeRun, key: str, policy: Policy,
             telemetry_note: str | None, cases: int = 1,
             order: tuple[str, ...] = ()) -> Judged:  # fmt: skip
    """Judge one A/B case: the tested side's run against the reference side's of the
    same sitting (``judging.ab``); strict as ``judge_one``; never recorded. ``order``: the
    case's processes as measured, look by look: the case is judged at look ``len(order)``
    (a side with fewer processes measures more rounds of a process per look)."""
    if reference_run.injected:
        raise CaseRefused(
            f"specperf: {key}: the A/B reference side ({reference.label}) ran with an injected "
            f"slowdown ({reference_run.injected}): restart it without SPECPERF_INJECT; "
            "--specperf-inject slows the tested side only"
        )
    look = max(1, len(order))
    case = _ab_case(inputs, request, server, run, key, cases, look)
    base = ab_baseline(inputs, request, reference, reference_run, key, cases,
                       server.fingerprint, look, run)  # fmt: skip
    outcome = judge_case(case, base, inputs.baseline_path, missing="", record=False)
    outcome = dataclasses.replace(outcome, verdict=as_ab_verdict(outcome.verdict))
    differ = engine_differences(reference.server.fingerprint, server.fingerprint)
    notes = (*outcome.notes, *([differ] if differ else []))
    outcome = dataclasses.replace(outcome, reference=reference.label, ab_order=order, notes=notes)
    problems, telemetry_note = _strict_check(
        outcome, server, policy, telemetry_note, recording=False
    )
    return Judged(case, outcome, problems, None, None, telemetry_note)
