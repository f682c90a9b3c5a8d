"""pytest-xdist: one server per worker, on its own GPU; the controller gathers the results.

``pytest perf_tests -n N`` starts N workers; each launches its own server (the session
fixture runs once per worker), pinned to its own GPU through ``CUDA_VISIBLE_DEVICES``
(set in the worker before anything initializes CUDA, so the worker's device detection,
its NVML sampler and the server it launches all see that one GPU). Workers judge their
cases as a single process does but never write baselines or reports: at the end each
sends its cases (``CaseView.to_json``), the cases it measured for an update
(``store.baselines.case_to_json``) and its notes through xdist's ``workeroutput``; the controller
gathers them (``pytest_testnodedown``), then writes the baselines once, the reports, and
prints one summary (``run.finish``, called from ``plugin.hooks``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_specperf.plugin.options import Settings
from pytest_specperf.plugin.session import SpecperfSession
from pytest_specperf.reporting.view import CaseView
from pytest_specperf.run.finish import Gathered
from pytest_specperf.store.baselines import case_from_json, case_to_json

#: The key of our results in a worker's ``workeroutput``.
OUTPUT_KEY = "specperf"


def worker_id(config: pytest.Config) -> str | None:
    """``gw0``, ``gw1``, ... in a pytest-xdist worker; None elsewhere."""
    workerinput = getattr(config, "workerinput", None)
    return str(workerinput["workerid"]) if workerinput is not None else None


def planned_workers(config: pytest.Config) -> int:
    """Workers this process will start as the xdist controller (0: none)."""
    if worker_id(config) is not None or getattr(config.option, "dist", "no") == "no":
        return 0
    return len(getattr(config.option, "tx", None) or ())


def parallel_servers(config: pytest.Config) -> int:
    """Servers that run side by side on this machine in this run (1 without xdist)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return max(1, int(workerinput.get("workercount", 1)))
    return 1


def visible_gpus() -> int | None:
    """CUDA devices visible here, or None where CUDA is unusable (a CPU run)."""
    from pytest_specperf.telemetry.cuda import cuda_unavailable_reason

    if cuda_unavailable_reason() is not None:
        return None
    import torch

    return int(torch.cuda.device_count())


def check_controller(config: pytest.Config, settings: Settings) -> int:
    """Refuse a distribution that cannot work; return the number of workers."""
    n = planned_workers(config)
    if n <= 1:
        return n
    if settings.server_url:
        raise pytest.UsageError(
            f"-n {n} with --specperf-attach: every worker would measure the one "
            "attached server at the same time; attach without -n, or let each worker "
            "launch its own server"
        )
    gpus = visible_gpus()
    if gpus is not None and n > gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise pytest.UsageError(
            f"-n {n}: only {gpus} GPU(s) visible{shown}; each xdist worker runs its own "
            f"server on its own GPU: use -n {gpus} or fewer"
        )
    return n


def worker_gpu(worker: str, workers: int, visible: str | None) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` value for ``worker`` (``gw<K>``): the K-th visible
    device, or None to leave the environment as it is (no GPU listed)."""
    index = int(worker.removeprefix("gw")) % max(workers, 1)  # a restarted worker: gw<N+k>
    if visible is None:
        return str(index)
    devices = [d.strip() for d in visible.split(",") if d.strip()]
    if not devices:
        return None  # CUDA_VISIBLE_DEVICES="" hides every GPU: a CPU run
    return devices[index % len(devices)]


def pin_worker(config: pytest.Config) -> None:
    """In a worker: restrict CUDA to the worker's own GPU (harmless on a CPU)."""
    wid = worker_id(config)
    if wid is None:
        return
    gpu = worker_gpu(wid, parallel_servers(config), os.environ.get("CUDA_VISIBLE_DEVICES"))
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu


def worker_output(sess: SpecperfSession, server: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a worker sends the controller: plain JSON types only."""
    out: dict[str, Any] = {
        "cases": [c.to_json() for c in sess.cases],
        "to_record": [case_to_json(b) for b in sess.to_record],
        "notes": list(sess.notes),
        "errors": list(sess.errors),
        "telemetry_note": sess.telemetry_note,
        "backend_notes": sess.server.backend.notes() if sess.server is not None else [],
        "server": dict(server) if server is not None else None,
    }
    if sess.cases or sess.to_record:  # device detection only where cases ran
        out["device"] = sess.device().to_dict()
        out["baseline_path"] = str(sess.baseline_path)
        out["baselines"] = sess.display_path(sess.baseline_path)
    return out


def _merge_record(g: Gathered, data: Mapping[str, Any]) -> None:
    records = [case_from_json(b) for b in data.get("to_record") or ()]
    if not records:
        return
    path = Path(str(data["baseline_path"]))
    g.to_record.setdefault(path, (dict(data["device"]), []))[1].extend(records)


def _merge(sess: SpecperfSession, g: Gathered, data: Mapping[str, Any]) -> None:
    sess.cases += [CaseView.from_json(c) for c in data.get("cases") or ()]
    _merge_record(g, data)
    for note in data.get("notes") or ():
        if str(note) not in sess.notes:  # every worker reads the same inputs: say it once
            sess.notes.append(str(note))
    sess.errors += [str(e) for e in data.get("errors") or ()]
    sess.telemetry_note = data.get("telemetry_note") or sess.telemetry_note
    for line in data.get("backend_notes") or ():
        if line not in g.backend_notes:  # the workers run one backend: say it once
            g.backend_notes.append(str(line))
    if data.get("server"):
        g.servers.append(dict(data["server"]))
    if g.device is None and data.get("device"):
        g.device, g.baselines = dict(data["device"]), str(data["baselines"])
        g.baseline_path = str(data["baseline_path"])


def gather(sess: SpecperfSession, worker: str, output: Mapping[str, Any] | None,
           error: object) -> None:  # fmt: skip
    """Merge one worker's results into the controller's session."""
    g = sess.gathered
    if g is None:
        return
    data = (output or {}).get(OUTPUT_KEY)
    if data is None:
        if error is not None:
            sess.errors.append(
                f"xdist worker {worker} went down ({error}): the cases it was running are "
                "missing from the reports"
            )
        return
    try:
        _merge(sess, g, data)
    except (KeyError, TypeError, ValueError) as e:
        sess.errors.append(f"xdist worker {worker} sent unusable results: {e}")


def order_cases(cases: Sequence[CaseView], nodeids: Sequence[str]) -> list[CaseView]:
    """``cases`` in collection order (workers finish in any order); stable within a test."""
    rank = {n: i for i, n in enumerate(nodeids)}
    return sorted(cases, key=lambda c: rank.get(c.nodeid, len(rank)))
