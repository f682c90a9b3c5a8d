"""The map checked against the installed SGLang before a server starts (issue 29, items 3
and 4): the algorithm SGLang resolves, the version read from the source, required targets
and signatures, and the refusal with the list and the fix."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_cpu import live

from pytest_specperf.engines.sglang import check, preflight, sgl_plugin, source
from pytest_specperf.engines.sglang.algorithms import ALGORITHMS, families_for

ROOT = source.sglang_root()
needs_sglang = pytest.mark.skipif(
    ROOT is None,
    reason="needs SGLang's source (pip install --no-deps sglang==0.5.23, as .ci/run does)",
)
GEMMA4_DRAFT = {"architectures": ["Gemma4AssistantForCausalLM"]}


@pytest.mark.parametrize(
    ("algo", "draft", "expected"),
    [
        ("EAGLE", GEMMA4_DRAFT, "FROZEN_KV_MTP"),
        ("nextn", GEMMA4_DRAFT, "FROZEN_KV_MTP"),
        ("NEXTN", {"architectures": ["LlamaForCausalLMEagle"]}, "EAGLE"),
        ("EAGLE3", None, "EAGLE3"),
        ("STANDALONE", GEMMA4_DRAFT, "STANDALONE"),
        (None, GEMMA4_DRAFT, None),
    ],
)
def test_unit_resolved_algorithm(
    algo: str | None, draft: dict | None, expected: str | None
) -> None:
    assert preflight.resolved_algorithm(algo, draft) == expected


@needs_sglang
def test_the_gemma4_rule_is_sglangs() -> None:
    """The architectures and the promotion are read from SGLang's own resolution code."""
    assert ROOT is not None
    text = (ROOT / "srt" / "arg_groups" / "speculative_hook.py").read_text()
    for arch in preflight.GEMMA4_ASSISTANTS:
        assert f'"{arch}"' in text
    assert 'return "FROZEN_KV_MTP"' in text


@needs_sglang
@pytest.mark.parametrize("algo", [a for a in ALGORITHMS if families_for(a)])
def test_the_builtin_map_fits_the_installed_sglang(algo: str) -> None:
    assert ROOT is not None
    pm = preflight.check_map(ROOT, source.installed_version(), algo, {}, None)
    assert any(e.role == "step" for e in pm.active())


def _copy_sglang(tmp_path: Path) -> Path:
    assert ROOT is not None
    dst = tmp_path / "sglang"
    shutil.copytree(ROOT / "srt" / "speculative", dst / "srt" / "speculative")
    for sub in ("managers", "mem_cache", "model_executor", "arg_groups"):
        shutil.copytree(
            ROOT / "srt" / sub, dst / "srt" / sub, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ("version.py", "_version.py", "__init__.py"):
        shutil.copy(ROOT / name, dst / name)
    (dst / "srt" / "__init__.py").write_text("")
    return dst


@needs_sglang
def test_a_missing_target_and_a_changed_signature_refuse_with_the_list(tmp_path: Path) -> None:
    root = _copy_sglang(tmp_path)
    worker = root / "srt" / "speculative" / "eagle_worker_v2.py"
    text = worker.read_text()
    assert "def _draft_extend_for_decode(" in text
    worker.write_text(
        text.replace("def _draft_extend_for_decode(", "def _draft_extend_for_decode_v2(", 1)
    )
    sched = root / "srt" / "managers" / "schedule_batch.py"
    text = sched.read_text()
    assert "def prepare_for_decode(self)" in text
    sched.write_text(
        text.replace("def prepare_for_decode(self)", "def prepare_for_decode(self, extra)", 1)
    )
    with pytest.raises(preflight.MapMismatch) as err:
        preflight.check_map(root, "0.5.23", "EAGLE", {}, None)
    msg = str(err.value)
    assert (
        "missing: sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker."
        "_draft_extend_for_decode (draft" in msg
    )
    assert "did you mean '_draft_extend_for_decode_v2' (line " in msg  # the renamed method
    assert "signature: sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode" in msg
    assert "specperf sglang-check --algorithm EAGLE" in msg


@needs_sglang
def test_a_release_without_a_map_is_refused_unless_one_is_named() -> None:
    assert ROOT is not None
    with pytest.raises(
        preflight.MapMismatch,
        match=r"SGLang 0\.5\.24 has no built-in phase "
        r"map.*SPECPERF_SGLANG_MAP=<version>",
    ):
        preflight.check_map(ROOT, "0.5.24", "EAGLE3", {}, None)
    named = {preflight.ENV_SGLANG_MAP: "0.5.23"}
    assert preflight.check_map(ROOT, "0.5.24", "EAGLE3", named, None).sources == (
        "phase_map_0_5_23.yaml",
    )
    with pytest.raises(preflight.MapMismatch, match=r"'0\.4' is not a built-in phase map"):
        preflight.check_map(ROOT, "0.5.24", "EAGLE3", {preflight.ENV_SGLANG_MAP: "0.4"}, None)
    # a fork of 0.5.23 (local version label) uses 0.5.23's map
    assert preflight.base_map("0.5.23+myfork", {})[1] is None


def test_unit_source_version_is_not_the_fallback(tmp_path: Path) -> None:
    """``version.py`` of 0.5.23 assigns ``0.0.0.dev0`` only in its last fallback; the built
    package's ``_version.py`` has the release."""
    root = tmp_path / "sglang"
    (root / "srt").mkdir(parents=True)
    (root / "version.py").write_text(
        "try:\n    from sglang._version import __version__\nexcept ImportError:\n"
        "    __version__ = '0.0.0.dev0'\n"
    )
    assert check._source_version(root) is None
    (root / "_version.py").write_text("__version__ = version = '0.5.23'\n")
    assert check._source_version(root) == "0.5.23"
    assert check.locate_source(str(tmp_path))[1] == "0.5.23"


@pytest.mark.live_sglang
@pytest.mark.skipif(live.missing() is not None, reason=live.missing() or "")
def test_in_server_algorithm_is_sglangs_resolved_value() -> None:
    """In the scheduler the plugin reads ``overrides.resolution_result``: a Gemma4 assistant
    draft typed as EAGLE runs (and is mapped) as FROZEN_KV_MTP."""
    code = (
        "import sglang.srt.server_args  # as in a scheduler: ServerArgs's module\n"
        "from types import SimpleNamespace\n"
        "from pytest_specperf.engines.sglang import sgl_plugin\n"
        "args = SimpleNamespace(speculative_algorithm='EAGLE', _resolved_overrides=[\n"
        "    ('handle_speculative_decoding', {'speculative_algorithm': 'FROZEN_KV_MTP'})])\n"
        "print(sgl_plugin._algorithm({'server_args': args}))\n"
    )
    env = live.server_env(None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.stdout.strip().splitlines()[-1:] == ["FROZEN_KV_MTP"], out.stderr[-2000:]


def test_unit_in_server_algorithm_without_a_resolution_record() -> None:
    from types import SimpleNamespace

    args = SimpleNamespace(speculative_algorithm="EAGLE3")
    assert sgl_plugin._algorithm({"server_args": args}) == "EAGLE3"
