"""The device's noise prior: ``<baselines>/<device-slug>.prior.yaml``, beside the baselines.

A comparison whose baseline holds one sitting (or whose runs cannot estimate the process
term) takes the missing variance from this file: what ``specperf calibrate`` measured on
the device (``judging.noise.LevelPrior`` per kind of judged form). Without the file the
plugin uses ``judging.noise.PROVISIONAL_PRIOR`` and says so. The file is read with the
baseline store's care (size and shape limits, safe loading only, symbolic links to regular
files only) and written atomically under its lock::

    schema_version: 1
    source: specperf calibrate --sittings 3, cal-2026-12-04 (3 sittings x 5 processes)
    provisional: false
    phase: {between: 0.0081, between_df: 24, sitting: 0.0093, sitting_df: 12}
    step:  {between: 0.027, between_df: 24, sitting: 0.041, sitting_df: 12}

Standard deviations are in log units (about fractions: 0.0093 is 0.93%).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pytest_specperf.judging.noise import PRIOR_KINDS, PROVISIONAL_PRIOR, DevicePrior, LevelPrior
from pytest_specperf.store.baseline_io import (
    LOCK_TIMEOUT_S,
    BaselineError,
    FlowMap,
    atomic_write,
    dump_yaml,
    locked,
    parse_yaml,
    read_bounded,
    real_target,
)

PRIOR_SCHEMA_VERSION = 1
#: A prior file is small: a few lines.
MAX_PRIOR_BYTES = 64 * 1024
#: Largest standard deviation a prior may state (log units: 0.7 is a factor of 2).
MAX_SD = 0.7
#: Largest degrees of freedom a prior may claim.
MAX_DF = 10_000
_LEVEL_FIELDS = ("between", "between_df", "sitting", "sitting_df")
_TOP_FIELDS = ("schema_version", "source", "provisional", *PRIOR_KINDS)


def prior_path(baseline_path: Path) -> Path:
    """``baselines/cpu-amd-epyc-2c.yaml`` -> ``baselines/cpu-amd-epyc-2c.prior.yaml``."""
    return baseline_path.with_name(f"{baseline_path.stem}.prior.yaml")


def baseline_files(directory: Path) -> list[Path]:
    """The baseline files in ``directory``, sorted: every ``*.yaml`` but the device priors
    beside them (``prior_path``)."""
    return [p for p in sorted(directory.glob("*.yaml")) if not p.name.endswith(".prior.yaml")]


def _level(path: Path, raw: Any, kind: str) -> LevelPrior:
    if not isinstance(raw, dict) or set(raw) != set(_LEVEL_FIELDS):
        raise BaselineError(
            path, f"{kind}: expected a mapping of exactly {', '.join(_LEVEL_FIELDS)}; fix it, "
            "or remove the file to use the provisional prior",
        )  # fmt: skip
    vals: dict[str, float] = {}
    for f in _LEVEL_FIELDS:
        v = raw[f]
        limit = MAX_DF if f.endswith("_df") else MAX_SD
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise BaselineError(path, f"{kind}.{f}: expected a number, got {str(v)[:40]!r}")
        if not 0 <= v <= limit:
            raise BaselineError(path, f"{kind}.{f}: must be from 0 to {limit:g}, got {v:g}")
        vals[f] = float(v)
    return LevelPrior(**vals)


def load_prior(baseline_path: Path) -> DevicePrior:
    """The prior beside ``baseline_path``, or ``PROVISIONAL_PRIOR`` when there is none;
    ``BaselineError`` (naming the file, the field and the fix) when it is unusable."""
    path = prior_path(baseline_path)
    text = read_bounded(path, MAX_PRIOR_BYTES)
    if text is None:
        return PROVISIONAL_PRIOR
    data = parse_yaml(text, path)
    if not isinstance(data, dict):
        raise BaselineError(path, "top level: expected a mapping")
    extra = sorted(str(k) for k in data if k not in _TOP_FIELDS)
    if extra:
        raise BaselineError(path, f"unknown field(s) {', '.join(extra)[:120]} "
                            f"(expected {', '.join(_TOP_FIELDS)})")  # fmt: skip
    if data.get("schema_version") != PRIOR_SCHEMA_VERSION:
        raise BaselineError(
            path, f"schema_version is {data.get('schema_version')!r}: this pytest-specperf "
            f"reads version {PRIOR_SCHEMA_VERSION}; upgrade, or re-run specperf calibrate",
        )  # fmt: skip
    source, provisional = data.get("source"), data.get("provisional")
    if not isinstance(source, str) or not 0 < len(source) <= 300:
        raise BaselineError(path, "source: expected a text of 1 to 300 characters")
    if not isinstance(provisional, bool):
        raise BaselineError(path, f"provisional: expected true or false, got {provisional!r}")
    phase, step = (_level(path, data.get(kind), kind) for kind in PRIOR_KINDS)
    return DevicePrior(phase, step, source, provisional)


def _level_dict(p: LevelPrior) -> FlowMap:
    return FlowMap(
        between=float(f"{p.between:.4g}"),
        between_df=float(f"{p.between_df:.4g}"),
        sitting=float(f"{p.sitting:.4g}"),
        sitting_df=float(f"{p.sitting_df:.4g}"),
    )


def write_prior(baseline_path: Path, prior: DevicePrior) -> Path:
    """Write ``prior`` beside ``baseline_path``, atomically, under the file's lock."""
    path = prior_path(baseline_path)
    doc = {
        "schema_version": PRIOR_SCHEMA_VERSION,
        "source": prior.source,
        "provisional": prior.provisional,
        **{kind: _level_dict(prior.of(kind)) for kind in PRIOR_KINDS},
    }
    target = real_target(path) or path
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target, LOCK_TIMEOUT_S):
        atomic_write(target, dump_yaml(doc))
    return path
