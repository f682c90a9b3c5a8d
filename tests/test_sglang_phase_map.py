"""Unit tests of the SGLang phase map: built-in data, user extension files, validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specperf.engines.sglang.phase_map import (
    HookEntry,
    PhaseMapError,
    builtin_name_for,
    builtin_versions,
    load_builtin,
    load_effective,
    load_file,
    parse_map,
    version_tuple,
)
from pytest_specperf.probe.phases import PHASES


def test_unit_builtin_map_covers_every_phase_and_the_required_families() -> None:
    pm = load_builtin("0.5.23")
    phases = {e.phase for e in pm.active() if e.role == "phase"}
    assert phases == set(PHASES)
    steps = {e.target.rsplit(".", 2)[-2] for e in pm.active() if e.role == "step"}
    assert {"EAGLEWorkerV2", "DFlashWorkerV2", "DFlashWorker"} <= steps
    graphs = {e.target.rsplit(".", 2)[-2] for e in pm.active() if e.role == "graph"}
    assert {"DecodeCudaGraphRunner", "EAGLEDraftCudaGraphRunner",
            "EAGLEDraftExtendCudaGraphRunner", "EagerRunner"} <= graphs
    roles = {e.role for e in pm.active()}
    assert {"step_result", "kv_release", "kv_flush", "idle"} <= roles
    forks = [e.target for e in pm.active() if e.optional]
    assert any(t.endswith("DFlashWorker._build_ddtree_verify_input") for t in forks)


def test_unit_version_selection() -> None:
    assert builtin_versions()[0] == ((0, 5, 23), "phase_map_0_5_23.yaml")
    assert builtin_name_for("0.5.23") == "phase_map_0_5_23.yaml"
    assert builtin_name_for("0.6.1") == "phase_map_0_5_23.yaml"  # newest not newer
    assert builtin_name_for("0.4.0") == "phase_map_0_5_23.yaml"  # nothing older: oldest
    assert builtin_name_for(None) == "phase_map_0_5_23.yaml"
    assert version_tuple("0.5.23.post1") == (0, 5, 23)
    assert version_tuple("0.5.23rc1") == (0, 5, 23)
    assert version_tuple("1.0.0+cu124") == (1, 0, 0)


def test_unit_arg_index_respects_keyword_only_parameters() -> None:
    e = HookEntry(target="m.f", role="phase", phase="verify",
                  params=("self", "batch", "is_verify", "*", "later"))
    assert e.arg_index("batch") == 1
    assert e.arg_index("is_verify") == 2
    assert e.arg_index("later") is None  # keyword-only: never positional
    assert e.arg_index("absent") is None
    assert HookEntry(target="m.f", role="step").arg_index("batch") is None


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "fork_map.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_unit_user_file_extends_replaces_and_disables(tmp_path: Path) -> None:
    path = _write(tmp_path, """
schema: 1
entries:
  - target: myfork.worker.DDTreeWorker.forward_batch_generation
    role: step
    params: [self, batch]
  - target: myfork.worker.DDTreeWorker.build_tree
    role: phase
    phase: build_verify_input
  - target: sglang.srt.speculative.eagle_utils.eagle_sample
    role: phase
    phase: verify
  - target: sglang.srt.managers.scheduler.Scheduler.on_idle
    role: disabled
""")
    pm = load_effective("0.5.23", str(path))
    by = pm.by_target()
    assert by["myfork.worker.DDTreeWorker.build_tree"].phase == "build_verify_input"
    assert by["myfork.worker.DDTreeWorker.build_tree"].source == str(path)
    assert by["sglang.srt.speculative.eagle_utils.eagle_sample"].phase == "verify"
    active = {e.target for e in pm.active()}
    assert "sglang.srt.managers.scheduler.Scheduler.on_idle" not in active
    assert pm.sources == ("phase_map_0_5_23.yaml", str(path))


BAD = [
    ("schema: 1\nentries: [", "not valid YAML"),
    ("- a\n- b\n", "top level: must be a mapping"),
    ("schema: 2\nentries: []\n", "'schema' must be 1"),
    ("schema: 1\nentries: []\nextra: 1\n", "unknown key(s) extra"),
    ("schema: 1\nentries: {}\n", "'entries' must be a list"),
    ("schema: 1\nsglang_version: 0.5\nentries: []\n", "'sglang_version' must be a string"),
    ("schema: 1\nentries: [42]\n", "entry 0: must be a mapping"),
    ("schema: 1\nentries:\n - {target: a.b.c, role: phase, phase: draft, colour: red}\n",
     "entry 0 (a.b.c): unknown key(s) colour"),
    ("schema: 1\nentries:\n - {target: nodots, role: step}\n", "'target' must be a dotted path"),
    ("schema: 1\nentries:\n - {target: a.b, role: timer}\n", "'role' must be one of"),
    ("schema: 1\nentries:\n - {target: a.b, role: phase}\n", "'phase' must be one of"),
    ("schema: 1\nentries:\n - {target: a.b, role: phase, phase: drafting}\n",
     "got 'drafting'"),
    ("schema: 1\nentries:\n - {target: a.b, role: graph, replay: true, phase: draft}\n",
     "'phase' is only valid with role 'phase'"),
    ("schema: 1\nentries:\n - {target: a.b, role: step, params: self}\n",
     "'params' must be a list"),
    ("schema: 1\nentries:\n - {target: a.b, role: step, params: [self, 'x-y']}\n",
     "'params' must be a list"),
    ("schema: 1\nentries:\n - {target: a.b, role: phase, phase: draft, when: {attr: x}}\n",
     "'when' must be {self_attr: NAME} or {arg: NAME}"),
    ("schema: 1\nentries:\n - {target: a.b, role: phase, phase: draft, when: {arg: 3}}\n",
     "'when.arg' must be an identifier"),
    ("schema: 1\nentries:\n - {target: a.b, role: step, when: {arg: x}}\n",
     "'when' is only valid with role 'phase'"),
    ("schema: 1\nentries:\n - {target: a.b, role: phase, phase: draft, outermost: yes please}\n",
     "'outermost' must be true or false"),
    ("schema: 1\nentries:\n - {target: a.b, role: step, outermost: true}\n",
     "'outermost' is only valid with role 'phase'"),
    ("schema: 1\nentries:\n - {target: a.b, role: graph}\n", "needs 'replay: true'"),
    ("schema: 1\nentries:\n - {target: a.b, role: step, replay: true}\n",
     "'replay' is only valid with role 'graph'"),
    ("schema: 1\nentries:\n - {target: a.b, role: step, label: X}\n", "'label' must be"),
    ("schema: 1\nentries:\n - {target: a.b, role: step, optional: maybe}\n",
     "'optional' must be true or false"),
    ("schema: 1\nentries:\n - {target: a.b, role: step, note: 3}\n", "'note' must be a string"),
    ("schema: 1\nentries:\n - {target: a.b, role: step}\n - {target: a.b, role: step}\n",
     "entry 1 (a.b): duplicate target"),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m for _, m in BAD])
def test_unit_bad_user_file_names_file_and_entry(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(PhaseMapError) as exc:
        load_file(path)
    assert str(path) in str(exc.value)
    assert message in str(exc.value)


def test_unit_missing_user_file(tmp_path: Path) -> None:
    with pytest.raises(PhaseMapError, match="cannot read"):
        load_file(tmp_path / "nope.yaml")


def test_unit_parse_map_accepts_minimal_document() -> None:
    pm = parse_map({"schema": 1, "entries": [{"target": "a.b", "role": "idle"}]}, "inline")
    assert pm.entries[0].role == "idle" and pm.sources == ("inline",)

