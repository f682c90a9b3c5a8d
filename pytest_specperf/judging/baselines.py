"""YAML baseline store: ``<dir>/<device-slug>.yaml``, one file per device model.

Layout (``schema_version: 1``)::

    schema_version: 1
    device: {name: ..., kind: cpu, ...}
    cases:
      perf_tests/test_long_context.py::test_decode:      # test id (no parameters)
        ctx=46000 kv=fragmented bs=1:                     # case key
          context_len: 46000
          kv_layout: fragmented
          batch_size: 1
          fingerprint: {backend: reference, engine_version: ..., config: tiny, ...}
          recorded_at: '2026-11-29T10:00:00+00:00'
          steps: 32
          metrics:
            step: {n: 32, median: 26.61, ..., blocks: [26.5, 26.7, ...]}
            verify: {...}

Files are read with ``yaml.safe_load`` only (a ``!!python/...`` tag is refused, never
constructed) and validated before use; any problem raises ``BaselineError`` naming the
file, and nothing on disk changes. Writes merge the cases measured in this run into the
existing file (all other cases are kept), with sorted keys and 6-significant-digit
floats, through a temporary file in the same directory and an atomic rename.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_specperf.judging.stats import Summary

SCHEMA_VERSION = 1
#: Fingerprint fields that must match for a baseline to be comparable.
FINGERPRINT_KEYS = (
    "backend",
    "engine_version",
    "config",
    "config_hash",
    "model",
    "draft_model",
    "speculative_algorithm",
    "num_draft_tokens",
    "simulate_accept_len",
    "dtype",
    "device_type",
    "cuda_graphs",
)


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file and the fix."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@dataclass
class CaseBaseline:
    test: str
    key: str
    context_len: int
    kv_layout: str
    batch_size: int
    fingerprint: dict[str, Any]
    recorded_at: str
    steps: int
    metrics: dict[str, Summary]

    def to_dict(self) -> dict[str, Any]:
        return {
            "context_len": self.context_len,
            "kv_layout": self.kv_layout,
            "batch_size": self.batch_size,
            "fingerprint": dict(self.fingerprint),
            "recorded_at": self.recorded_at,
            "steps": self.steps,
            "metrics": {k: v.to_dict() for k, v in self.metrics.items()},
        }


@dataclass
class BaselineFile:
    path: Path
    device: dict[str, Any] = field(default_factory=dict)
    cases: dict[str, dict[str, CaseBaseline]] = field(default_factory=dict)

    def get(self, test: str, key: str) -> CaseBaseline | None:
        return self.cases.get(test, {}).get(key)

    def case_count(self) -> int:
        return sum(len(v) for v in self.cases.values())


def fingerprint_mismatch(base: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Human-readable differences in the comparable fingerprint fields."""
    out = []
    for k in FINGERPRINT_KEYS:
        if base.get(k) != now.get(k):
            out.append(f"{k}: baseline {base.get(k)!r}, now {now.get(k)!r}")
    return out


def _expect(cond: bool, path: Path, where: str, what: str) -> None:
    if not cond:
        raise BaselineError(path, f"{where}: {what}")


def _parse_case(path: Path, test: str, key: str, d: Any) -> CaseBaseline:
    where = f"cases[{test!r}][{key!r}]"
    _expect(isinstance(d, dict), path, where, "expected a mapping")
    for name, typ in (
        ("context_len", int),
        ("batch_size", int),
        ("steps", int),
        ("kv_layout", str),
        ("recorded_at", str),
        ("fingerprint", dict),
        ("metrics", dict),
    ):
        v = d.get(name)
        ok = isinstance(v, typ) and not isinstance(v, bool)
        _expect(ok, path, f"{where}.{name}", f"expected {typ.__name__}, got {v!r:.60}")
    metrics = {}
    for m, s in d["metrics"].items():
        try:
            metrics[str(m)] = Summary.from_dict(s, f"{where}.metrics.{m}")
        except ValueError as e:
            raise BaselineError(path, str(e)) from None
    return CaseBaseline(
        test=test,
        key=key,
        context_len=d["context_len"],
        kv_layout=d["kv_layout"],
        batch_size=d["batch_size"],
        fingerprint=d["fingerprint"],
        recorded_at=d["recorded_at"],
        steps=d["steps"],
        metrics=metrics,
    )


def load_baselines(path: Path) -> BaselineFile | None:
    """Read and validate ``path``; ``None`` if it does not exist."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise BaselineError(path, f"cannot read: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.constructor.ConstructorError as e:
        raise BaselineError(
            path,
            f"refused: the file uses a YAML tag that safe loading does not allow ({e.problem}"
            f"{' ' + str(e.problem_mark).strip() if e.problem_mark else ''}); baselines hold "
            "plain data only: delete the tagged entry, or move the file away and re-record "
            "with --specperf-update-baselines",
        ) from None
    except yaml.YAMLError as e:
        raise BaselineError(
            path,
            f"malformed YAML: {e}; fix the file, or move it away and re-record with "
            "--specperf-update-baselines",
        ) from None
    if data is None:
        data = {}
    _expect(isinstance(data, dict), path, "top level", "expected a mapping")
    version = data.get("schema_version")
    _expect(
        version == SCHEMA_VERSION,
        path,
        "schema_version",
        f"is {version!r}, this pytest-specperf reads version {SCHEMA_VERSION}; move the file "
        "away and re-record with --specperf-update-baselines (or upgrade pytest-specperf if "
        "the file is newer)",
    )
    device = data.get("device", {})
    _expect(isinstance(device, dict), path, "device", "expected a mapping")
    cases_raw = data.get("cases", {})
    _expect(isinstance(cases_raw, dict), path, "cases", "expected a mapping")
    cases: dict[str, dict[str, CaseBaseline]] = {}
    for test, per_key in cases_raw.items():
        _expect(isinstance(per_key, dict), path, f"cases[{test!r}]", "expected a mapping")
        cases[str(test)] = {
            str(key): _parse_case(path, str(test), str(key), d) for key, d in per_key.items()
        }
    return BaselineFile(path=path, device=device, cases=cases)


def _dumper() -> Any:
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True  # plain, self-contained entries: no &anchors / *aliases

    def represent_list(dumper: Any, data: list[Any]) -> Any:
        flow = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in data)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)

    Dumper.add_representer(list, represent_list)
    return Dumper


def dump_baselines(bf: BaselineFile) -> str:
    import yaml

    data = {
        "schema_version": SCHEMA_VERSION,
        "device": bf.device,
        "cases": {t: {k: c.to_dict() for k, c in per.items()} for t, per in bf.cases.items()},
    }
    out: str = yaml.dump(
        data,
        Dumper=_dumper(),
        sort_keys=True,
        default_flow_style=False,
        width=100,
        allow_unicode=True,
    )
    return out


def write_baselines(
    path: Path, device: dict[str, Any], measured: list[CaseBaseline]
) -> BaselineFile:
    """Merge ``measured`` into ``path`` (other cases kept) and write it atomically.

    The existing file is validated first; if it is unusable, ``BaselineError`` is raised
    and the file is left as it is.
    """
    existing = load_baselines(path) or BaselineFile(path=path)
    merged = BaselineFile(
        path=path, device=dict(device), cases={t: dict(per) for t, per in existing.cases.items()}
    )
    for c in measured:
        merged.cases.setdefault(c.test, {})[c.key] = c
    text = dump_baselines(merged)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(OSError):
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return merged
