"""Unit tests of the SGLang phase map: built-in data, user extension files, validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specperf.engines.sglang.phase_map import (
    EXAMPLE_FORK_MAP,
    HookEntry,
    PhaseMapError,
    builtin_name_for,
    builtin_versions,
    example_fork_map_path,
    load_builtin,
    load_effective,
    load_example_fork_map,
    load_file,
    parse_map,
    version_tuple,
)
from pytest_specperf.probe.phases import PHASES


def test_unit_builtin_map_covers_every_phase_and_the_required_families() -> None:
    pm = load_builtin("0.5.23")
    phases = {e.phase for e in pm.active() if e.role == "phase"}
    assert phases | {"ingest"} == set(PHASES)  # the iteration entry times ingest
    assert [e.target for e in pm.active() if e.role == "iteration"] == [
        "sglang.srt.managers.scheduler.Scheduler.ingest_requests"
    ]
    steps = {e.target.rsplit(".", 2)[-2] for e in pm.active() if e.role == "step"}
    assert {"EAGLEWorkerV2", "DFlashWorkerV2", "DFlashWorker"} <= steps
    graphs = {e.target.rsplit(".", 2)[-2] for e in pm.active() if e.role == "graph"}
    assert {"DecodeCudaGraphRunner", "EAGLEDraftCudaGraphRunner",
            "EAGLEDraftExtendCudaGraphRunner", "EagerRunner"} <= graphs
    roles = {e.role for e in pm.active()}
    assert {"step_result", "kv_release", "kv_flush", "idle", "iteration"} <= roles
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
  - target: sglang.srt.speculative.ddtree_worker.DDTreeWorker.forward_batch_generation
    role: step
    params: [self, batch]
  - target: sglang.srt.speculative.ddtree_worker.DDTreeWorker.build_tree
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
    tree = by["sglang.srt.speculative.ddtree_worker.DDTreeWorker.build_tree"]
    assert tree.phase == "build_verify_input" and tree.source == str(path)
    assert tree.line == 7 and tree.where() == f"{path}:7"
    assert tree.owner == "sglang.srt.speculative.ddtree_worker.DDTreeWorker"
    assert by["sglang.srt.speculative.eagle_utils.eagle_sample"].phase == "verify"
    assert by["sglang.srt.speculative.eagle_utils.eagle_sample"].owner is None
    active = {e.target for e in pm.active()}
    assert "sglang.srt.managers.scheduler.Scheduler.on_idle" not in active
    assert pm.sources == ("phase_map_0_5_23.yaml", str(path))


T = "sglang.srt.x.Y.z"
BAD = [
    # (file text, message, line named)
    ("schema: 1\nentries: [", "not valid YAML", 2),
    ("- a\n- b\n", "top level: must be a mapping", 1),
    ("schema: 2\nentries: []\n", "'schema' must be 1", 1),
    ("schema: 1\nentries: []\nextra: 1\n", "unknown key(s) extra", 3),
    ("schema: 1\nentries: {}\n", "'entries' must be a list", 2),
    ("schema: 1\nsglang_version: 0.5\nentries: []\n", "'sglang_version' must be a string", 2),
    ("schema: 1\nentries: [42]\n", "entry 0: must be a mapping", 2),
    (f"schema: 1\nentries:\n - target: {T}\n   role: phase\n   phase: draft\n   colour: red\n",
     f"entry 0 ({T}): unknown key(s) colour", 6),
    ("schema: 1\nentries:\n - {target: nodots, role: step}\n", "'target' must be a dotted path",
     3),
    # a target outside SGLang
    ("schema: 1\nentries:\n - {target: myfork.worker.W.step, role: step}\n",
     "'target' 'myfork.worker.W.step' is outside SGLang", 3),
    ("schema: 1\nentries:\n - {target: json.dumps, role: phase, phase: draft}\n",
     "is outside SGLang", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: timer}}\n", "'role' must be one of", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: phase}}\n", "'phase' must be one of", 3),
    # an unknown phase
    (f"schema: 1\nentries:\n - target: {T}\n   role: phase\n   phase: drafting\n",
     "got 'drafting'", 5),
    (f"schema: 1\nentries:\n - {{target: {T}, role: graph, replay: true, phase: draft}}\n",
     "'phase' is only valid with role 'phase'", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: step, params: self}}\n",
     "'params' must be a list", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: step, params: [self, 'x-y']}}\n",
     "'params' must be a list", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: phase, phase: draft, when: {{attr: x}}}}\n",
     "'when' must be {self_attr: NAME}, {arg: NAME} or {not_arg: NAME}", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: phase, phase: draft, when: {{arg: 3}}}}\n",
     "'when.arg' must be an identifier", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: step, when: {{arg: x}}}}\n",
     "'when' is only valid with role 'phase' or 'graph'", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: phase, phase: draft, outermost: yes please}}\n",
     "'outermost' must be true or false", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: step, outermost: true}}\n",
     "'outermost' is only valid with role 'phase'", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: graph}}\n", "needs 'replay: true'", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: step, replay: true}}\n",
     "'replay' is only valid with role 'graph'", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: step, label: X}}\n", "'label' must be", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: step, optional: maybe}}\n",
     "'optional' must be true or false", 3),
    (f"schema: 1\nentries:\n - {{target: {T}, role: step, note: 3}}\n", "'note' must be a string",
     3),
    # a duplicate target
    (f"schema: 1\nentries:\n - {{target: {T}, role: step}}\n\n - {{target: {T}, role: idle}}\n",
     f"entry 1 ({T}): duplicate target (first at line 3)", 5),
    # YAML tags, including the harmless-looking standard ones
    ("schema: 1\nentries:\n - !!python/object:os.system {target: x}\n", "explicit tag", 3),
    (f"schema: 1\nentries:\n - target: {T}\n   role: !!str step\n", "explicit tag 'tag:yaml.org,2002:str'",
     4),
    ("schema: !!int 1\nentries: []\n", "not allowed in a phase map", 1),
]


@pytest.mark.parametrize(("text", "message", "line"), BAD, ids=[m for _, m, _ in BAD])
def test_unit_bad_user_file_names_file_line_and_entry(
    tmp_path: Path, text: str, message: str, line: int
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(PhaseMapError) as exc:
        load_file(path)
    assert message in str(exc.value)
    if "not valid YAML" in message:
        assert str(path) in str(exc.value) and f"line {line}" in str(exc.value)
    else:
        assert f"phase map {path}:{line}: " in str(exc.value), str(exc.value)


def test_unit_bad_user_file_patches_nothing(tmp_path: Path) -> None:
    """Validation is all or nothing: an error in the last entry rejects the whole file
    (what the plugin installs from it is tested in test_sglang_plugin.py)."""
    path = _write(tmp_path, f"schema: 1\nentries:\n - {{target: {T}, role: step}}\n"
                            " - {target: sglang.a.b, role: phase, phase: drafting}\n")
    with pytest.raises(PhaseMapError, match=r":4: entry 1 \(sglang.a.b\)"):
        load_effective("0.5.23", str(path))


def test_unit_missing_user_file(tmp_path: Path) -> None:
    with pytest.raises(PhaseMapError, match="cannot read"):
        load_file(tmp_path / "nope.yaml")
    binary = tmp_path / "map.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PhaseMapError, match="not UTF-8"):
        load_file(binary)


def test_unit_parse_map_accepts_minimal_document() -> None:
    pm = parse_map({"schema": 1, "entries": [{"target": "sglang.a.b", "role": "idle"}]}, "inline")
    assert pm.entries[0].role == "idle" and pm.sources == ("inline",)
    assert pm.entries[0].line is None and pm.entries[0].where() == "inline"


def test_unit_when_conditions_parse() -> None:
    pm = parse_map({"schema": 1, "entries": [
        {"target": "sglang.a.R.replay", "role": "graph", "replay": True,
         "when": {"not_arg": "step"}, "params": ["self", "step"]},
        {"target": "sglang.a.M.forward", "role": "phase", "phase": "draft",
         "when": {"self_attr": "is_draft_worker"}},
    ]}, "inline")
    replay, fwd = pm.entries
    assert replay.when_not_arg == "step" and replay.when_arg is None
    assert fwd.when_self_attr == "is_draft_worker"


def test_unit_builtin_and_example_maps_validate_with_lines() -> None:
    pm = load_builtin("0.5.23")
    assert all(e.line for e in pm.entries)
    assert all(e.target.startswith("sglang.") for e in pm.entries)
    example = load_example_fork_map()
    assert example.sources == (EXAMPLE_FORK_MAP,)
    assert example_fork_map_path().name == EXAMPLE_FORK_MAP and example_fork_map_path().is_file()
    assert load_file(example_fork_map_path()).by_target().keys() == example.by_target().keys()
