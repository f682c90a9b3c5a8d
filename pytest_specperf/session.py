"""Session state: settings, device, baselines, server, and the judging of cases.

One ``SpecperfSession`` per pytest session, stored in ``config.stash``; no globals.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_specperf.baselines import (
    BaselineError,
    BaselineFile,
    CaseBaseline,
    CaseProblem,
    WriteResult,
    fingerprint_mismatch,
    identity_of,
    load_baselines,
    write_baselines,
)
from pytest_specperf.diagnosis import diagnose, time_went
from pytest_specperf.engines.base import BackendSettings
from pytest_specperf.markers import CaseOptions
from pytest_specperf.measure import DecodeRun
from pytest_specperf.options import Settings
from pytest_specperf.plot import write_svg
from pytest_specperf.probe.phases import PHASES, UNACCOUNTED
from pytest_specperf.progress import Progress
from pytest_specperf.report import (
    JSON_SCHEMA_VERSION,
    CaseOutcome,
    case_json,
    failure_message,
    phase_table,
    summary_lines,
    write_json,
)
from pytest_specperf.telemetry.gates import invalid_reasons
from pytest_specperf.verdict import (
    QUIET_SCATTER,
    CaseVerdict,
    MetricVerdict,
    Tolerances,
    Verdict,
    Z,
    case_disturbance,
    combine,
    downgrade_disturbed,
    judge_gate,
    noisiest_phase,
)

if TYPE_CHECKING:
    from pytest_specperf.fixtures import SpecperfHandle
    from pytest_specperf.serving import ModelServer
    from pytest_specperf.telemetry.device import DeviceInfo
    from pytest_specperf.telemetry.nvml import TelemetrySampler

#: Utilizations gated by default when both runs have them (drops in points).
POINT_GATES = ("device_busy", "util.sm", "util.dram")
#: A phase is gated by default when it is at least this share of the baseline step.
MIN_GATED_SHARE = 0.05
#: Parameters that are already part of the case key (or are the layout fixture).
_KEYED_PARAMS = {"context_len", "batch_size", "fragmented_kv"}


def unstable_advice(m: MetricVerdict) -> str:
    """Why a metric could not be decided, and what would decide it."""
    unit = "pp" if m.share_based or m.points_based else "%"
    text = f"{m.metric} changed {m.change * 100:+.1f}{unit}"
    if m.disturbed and m.scatter_ratio is not None:
        if m.scatter_ratio < 1:
            return text + (
                f", but the baseline's blocks scatter {1 / m.scatter_ratio:.1f}x more than "
                "this run's: the baseline was recorded on a busy machine; re-record it on a "
                "quiet one"
            )
        return text + (
            f", but this run's blocks scatter {m.scatter_ratio:.1f}x more than the "
            "baseline's: the machine was busy or disturbed; rerun it on a quiet machine"
        )
    text += (
        f" within noise +-{m.noise * 100:.1f}{unit} (x{Z:g} = {Z * m.noise * 100:.1f}{unit} > "
        f"tol {m.tolerance * 100:.0f}{unit})"
    )
    if m.steps_to_decide:
        text += (
            f"; about {m.steps_to_decide} steps would decide: record the baseline and run "
            f"with --specperf-steps {m.steps_to_decide} (or the marker's steps=)"
        )
    return text


def test_id(item: pytest.Item) -> str:
    """The node id without its parametrization: the baseline's test key."""
    return re.sub(r"\[.*\]$", "", item.nodeid)


def case_key(item: pytest.Item, run: DecodeRun) -> str:
    key = f"ctx={run.context_len} kv={run.kv_layout.label} bs={run.batch_size}"
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        extra = sorted((k, v) for k, v in callspec.params.items() if k not in _KEYED_PARAMS)
        key += "".join(f" {k}={v}" for k, v in extra)
    return key


class SpecperfWarning(pytest.PytestWarning):
    """A case that could not be judged (INVALID) or another condition worth a look."""


class SpecperfSession:
    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.progress = Progress(config)
        self.outcomes: list[CaseOutcome] = []
        self.to_record: list[CaseBaseline] = []
        self.server: ModelServer | None = None
        self.server_error: str | None = None
        self._device: DeviceInfo | None = None
        self._baselines: BaselineFile | None = None
        self._baselines_loaded = False
        self.written: WriteResult | None = None
        self.errors: list[str] = []
        self.telemetry_note: str | None = None
        self.noisy_baselines: list[str] = []

    # -- device and baselines --------------------------------------------------------------
    def device(self) -> DeviceInfo:
        if self._device is None:
            from pytest_specperf.telemetry.device import detect_device

            self._device = detect_device(override_slug=self.settings.device_slug)
        return self._device

    @property
    def baseline_path(self) -> Path:
        return self.settings.baselines_dir / f"{self.device().slug}.yaml"

    def display_path(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.config.rootpath))
        except ValueError:
            return str(path)

    def baselines(self) -> BaselineFile | None:
        """The device's baseline file, validated once; ``BaselineError`` if unusable."""
        if not self._baselines_loaded:
            self._baselines = load_baselines(self.baseline_path)
            self._baselines_loaded = True
        return self._baselines

    def telemetry_sampler(self) -> TelemetrySampler | None:
        """An NVML sampler for the server's GPU, or None (and a note saying why)."""
        dev = self.device()
        if dev.kind != "cuda":
            self.telemetry_note = "telemetry unavailable: no CUDA device (CPU run); host-side view"
            return None
        if dev.nvml_index is None:
            why = "; ".join(dev.notes) or "NVML did not match the CUDA device"
            self.telemetry_note = f"telemetry unavailable: {why}"
            return None
        from pytest_specperf.telemetry.nvml import TelemetrySampler

        srv = self.server
        pids = set()
        if srv is not None:
            if srv.process is not None and srv.process.pid:
                pids.add(srv.process.pid)
            if isinstance(srv.server_info.get("pid"), int):
                pids.add(srv.server_info["pid"])
        return TelemetrySampler(dev.nvml_index, uuid=dev.uuid, own_pids=tuple(pids))

    def backend_settings(self) -> BackendSettings:
        s = self.settings
        return BackendSettings(
            model=s.model,
            draft_model=s.draft_model,
            server_args=s.server_args,
            inject=str(s.inject) if s.inject else None,
            nvtx=s.nvtx,
        )

    # -- judging -----------------------------------------------------------------------------
    def judge(self, item: pytest.Item, run: DecodeRun, opts: CaseOptions, key: str) -> CaseOutcome:
        assert self.server is not None
        fp = self.server.fingerprint
        test = test_id(item)
        path = self.baseline_path
        try:
            bf = self.baselines()
        except BaselineError as e:
            raise pytest.fail(str(e), pytrace=False) from None
        found = bf.lookup(identity_of(fp), test, key) if bf else None
        base = found if isinstance(found, CaseBaseline) else None
        tol = Tolerances(
            phase=opts.tolerance or self.settings.tolerance,
            step=opts.step_tolerance or self.settings.step_tolerance,
        )
        if isinstance(found, CaseProblem):
            verdict = CaseVerdict(Verdict.INVALID, reasons=[found.message])
        elif base is None:
            where = self.display_path(path)
            why = f"no baseline for {key} in {where}" if bf else f"no baseline file {where}"
            verdict = CaseVerdict(Verdict.NO_BASELINE, reasons=[why])
        else:
            mismatch = fingerprint_mismatch(base.fingerprint, fp)
            if mismatch:
                verdict = CaseVerdict(
                    Verdict.INVALID,
                    reasons=[
                        "engine fingerprint differs from the baseline's: "
                        + "; ".join(mismatch)
                        + " (re-record with --specperf-update-baselines if the change is intended)"
                    ],
                )
            else:
                verdict = self._compare(base, run, opts, tol)
        if run.telemetry is not None and not run.telemetry.available:
            self.telemetry_note = run.telemetry.reason
        if run.telemetry is not None and verdict.verdict is not Verdict.NO_BASELINE:
            bad = invalid_reasons(run.telemetry)
            if bad:  # throttled clocks or another process: never a regression
                verdict = CaseVerdict(Verdict.INVALID, verdict.metrics, [*verdict.reasons, *bad])
        outcome = CaseOutcome(
            nodeid=item.nodeid,
            test=test,
            key=key,
            run=run,
            verdict=verdict,
            baseline=base,
            baseline_path=path,
            fingerprint=fp,
            bottleneck=diagnose(run, self.server.server_info, self.device()),
            time_went=time_went(run, base),
            notes=[f"cross-check: {line}" for line in run.cross_check],
        )
        if self.settings.update_baselines:
            if run.telemetry is not None and invalid_reasons(run.telemetry):
                raise pytest.fail(
                    f"refusing to record {key} as a baseline: the measurement is not "
                    f"trustworthy: {'; '.join(invalid_reasons(run.telemetry))}",
                    pytrace=False,
                )
            if run.labels.get("inject"):
                raise pytest.fail(
                    f"refusing to record {key} as a baseline: the server injected a canary "
                    f"slowdown ({run.labels['inject']}); restart it without SPECPERF_INJECT",
                    pytrace=False,
                )
            self.to_record.append(self._as_baseline(test, key, run, fp))
            noisy = noisiest_phase(run.summaries)
            if noisy is not None and noisy[1] > QUIET_SCATTER:
                self.noisy_baselines.append(
                    f"noisy baseline: {test} {key}: {noisy[0]} blocks scatter "
                    f"{noisy[1]:.0%} (a quiet machine gives about 2%); re-record it when the "
                    "machine is quiet, or its comparisons will come out UNSTABLE"
                )
            outcome.recorded = True
        self.outcomes.append(outcome)
        return outcome

    def default_gates(self, base: CaseBaseline, run: DecodeRun) -> list[str]:
        """step, unaccounted, accept_len (speculative), every phase that is at least 5% of
        the baseline step, and on a GPU the device-busy share and SM/DRAM utilization."""
        gates = ["step", UNACCOUNTED]
        gates += [m for m in POINT_GATES if m in base.metrics and m in run.summaries]
        if self.server is not None and self.server.speculative:
            gates.append("accept_len")
        step = base.metrics["step"].median if "step" in base.metrics else 0.0
        for p in PHASES:
            b = base.metrics.get(p)
            if b is not None and step and b.median / step >= MIN_GATED_SHARE:
                gates.append(p)
        return gates

    def _compare(
        self, base: CaseBaseline, run: DecodeRun, opts: CaseOptions, tol: Tolerances
    ) -> CaseVerdict:
        gates = list(opts.gate) if opts.gate else self.default_gates(base, run)
        metrics: list[MetricVerdict] = []
        missing = []
        for m in gates:
            mv = judge_gate(m, base.metrics, run.summaries, tol)
            if mv is None:
                missing.append(m)
            else:
                metrics.append(mv)
        downgrade_disturbed(metrics, case_disturbance(base.metrics, run.summaries))
        v = combine([m.verdict for m in metrics])
        reasons = (
            [f"gated metric(s) {', '.join(missing)} missing in the baseline"] if missing else []
        )
        return CaseVerdict(v, metrics, reasons)

    def _as_baseline(self, test: str, key: str, run: DecodeRun, fp: dict[str, Any]) -> CaseBaseline:
        pid = self.server.server_info.get("pid") if self.server is not None else None
        return CaseBaseline.from_run(
            test=test,
            key=key,
            fingerprint=fp,
            steps=run.steps,
            metrics=run.summaries,
            pid=pid if isinstance(pid, int) else None,
        )

    def judge_item(self, item: pytest.Item, handle: SpecperfHandle) -> None:
        """Judge every run of a test that completed; fail it on a regression."""
        failures = []
        seen: dict[str, int] = {}
        for run in handle.runs:
            key = case_key(item, run)
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > 1:
                key += f" #{seen[key]}"
            outcome = self.judge(item, run, handle.options, key)
            if handle.expect_graphs and run.eager_forwards:
                failures.append(
                    f"CUDA graphs were warmed but {run.eager_forwards} measured forward(s) ran "
                    f"eagerly at {outcome.where}: {run.graphs}"
                )
            v = outcome.verdict.verdict
            if v is Verdict.SLOWER and not self.settings.update_baselines:
                if self.settings.profile_on_regression:
                    outcome.notes.append(self._profile(item, handle, outcome))
                failures.append(failure_message(outcome, self.display_path(outcome.baseline_path)))
                continue
            if v is Verdict.INVALID:
                item.warn(SpecperfWarning(f"{key}: INVALID: {'; '.join(outcome.verdict.reasons)}"))
            item.add_report_section(
                "call",
                "specperf",
                "\n".join([f"{key}: {v.value}", *phase_table(run, outcome.baseline)]),
            )
        if failures:
            pytest.fail("\n\n".join(failures), pytrace=False)

    def _profile(self, item: pytest.Item, handle: SpecperfHandle, outcome: CaseOutcome) -> str:
        """Profile a re-run of a regressed case; the note names the trace."""
        where = (
            self.settings.json_path.parent
            if self.settings.json_path
            else self.config.rootpath / "specperf-profiles"
        )
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{item.name}-{outcome.key}")[:150]
        trace = where / f"{name}-{stamp}.json"
        try:
            files = handle.profile(outcome.run, trace)
        except Exception as e:  # the regression is the news; a failed profile is a footnote
            return f"profile of a re-run failed: {type(e).__name__}: {e}"
        shown = ", ".join(self.display_path(f) for f in files) or "(no trace written)"
        return f"profile of a re-run of this case: {shown}"

    # -- end of session ------------------------------------------------------------------------
    def finish(self, session: pytest.Session, exitstatus: int) -> None:
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        if self.settings.update_baselines and self.to_record:
            if interrupted:
                self.errors.append("baselines not written: the run was interrupted")
            else:
                try:
                    self.written = write_baselines(
                        self.baseline_path, self.device().to_dict(), self.to_record
                    )
                except (BaselineError, OSError) as e:
                    self.errors.append(f"baselines not written: {e}")
                    session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.settings.json_path is not None and self.outcomes:
            try:
                write_json(self.settings.json_path, self.json_payload())
                write_svg(
                    self.settings.json_path.with_suffix(".svg"),
                    self.outcomes,
                    f"pytest-specperf: {self.settings.backend} on {self.device().slug}",
                )
            except OSError as e:
                self.errors.append(f"JSON report not written: {e}")
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def json_payload(self) -> dict[str, Any]:
        srv = self.server
        return {
            "schema_version": JSON_SCHEMA_VERSION,
            "device": self.device().to_dict(),
            "backend": self.settings.backend,
            "baselines": str(self.baseline_path),
            "tolerance": self.settings.tolerance,
            "step_tolerance": self.settings.step_tolerance,
            "update_baselines": self.settings.update_baselines,
            "server": None
            if srv is None
            else {
                "url": srv.url,
                "attached": srv.attached,
                "startup_s": round(srv.startup_s, 3),
                "pid": srv.server_info.get("pid"),
                "notes": srv.backend.notes(srv.run_dir),
                "log": str(srv.log_path or ""),
                "fingerprint": srv.fingerprint,
            },
            "cases": [case_json(o) for o in self.outcomes],
        }

    def summary_lines(self) -> list[str]:
        if not self.outcomes and not self.errors:
            return []
        lines = []
        if self.outcomes:
            lines.append(
                f"specperf: {self.settings.backend} backend, device {self.device().slug}, "
                f"baselines {self.display_path(self.baseline_path)}, tolerance "
                f"{self.settings.tolerance:.0%} (phases), {self.settings.step_tolerance:.0%} "
                "(step time)"
            )
            if self.settings.inject:
                lines.append(
                    f"canary injection active: {self.settings.inject} (runs are "
                    "labelled [injected] and never recorded as baselines)"
                )
            lines += summary_lines(self.outcomes)
        missing = [o for o in self.outcomes if o.verdict.verdict is Verdict.NO_BASELINE]
        if missing and not self.settings.update_baselines:
            lines.append(
                f"hint: {len(missing)} case(s) have no baseline in "
                f"{self.display_path(self.baseline_path)}; record them with: "
                "pytest perf_tests --specperf-update-baselines"
            )
        for o in self.outcomes:
            if o.verdict.verdict is Verdict.INVALID:
                lines.append(f"INVALID {o.test} {o.key}: {'; '.join(o.verdict.reasons)}")
            for m in o.verdict.metrics:
                if m.verdict is Verdict.UNSTABLE:
                    lines.append(f"UNSTABLE {o.test} {o.key}: {unstable_advice(m)}")
        if self.outcomes and self.telemetry_note:
            lines.append(self.telemetry_note)
        if self.outcomes and self.server is not None:
            lines += self.server.backend.notes(self.server.run_dir)
        lines += self.noisy_baselines
        if self.written is not None:
            n = len(self.to_record)
            lines.append(
                f"baselines written: {self.display_path(self.written.path)} "
                f"({n} case(s) recorded, {self.written.case_count() - n} kept)"
            )
        if (
            self.settings.json_path is not None
            and self.outcomes
            and not any(e.startswith("JSON") for e in self.errors)
        ):
            lines.append(
                f"JSON report: {self.settings.json_path} (picture: "
                f"{self.settings.json_path.with_suffix('.svg').name})"
            )
        lines += [f"ERROR: {e}" for e in self.errors]
        return lines


SESSION_KEY = pytest.StashKey[SpecperfSession]()


def get_session(config: pytest.Config) -> SpecperfSession:
    try:
        return config.stash[SESSION_KEY]
    except KeyError:
        raise RuntimeError(
            "pytest-specperf is not configured (was it disabled with -p no:specperf?)"
        ) from None
