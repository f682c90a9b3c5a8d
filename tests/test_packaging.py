"""A user with their own SGLang build or fork installs the plugin without touching it: no
core requirement names sglang; only the ``sglang`` extra does (README, "Install")."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _names_sglang(req: str) -> bool:
    return canonicalize_name(Requirement(req).name) == "sglang"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="reads pyproject.toml with tomllib")
def test_pyproject_core_requirements_leave_sglang_alone() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [r for r in project["dependencies"] if _names_sglang(r)]
    extras = project["optional-dependencies"]
    assert {name for name, reqs in extras.items() if any(map(_names_sglang, reqs))} == {"sglang"}
    # the plugin's sglang.srt.plugins entry point names our module, never SGLang's
    assert project["entry-points"]["sglang.srt.plugins"] == {
        "specperf": "pytest_specperf.engines.sglang.sgl_plugin:load"
    }


def test_installed_metadata_names_sglang_only_under_its_extra() -> None:
    try:
        reqs = importlib.metadata.requires("pytest-specperf") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pytest-specperf is not installed (running from a source tree)")
    sglang = [Requirement(r) for r in reqs if _names_sglang(r)]
    assert sglang, "the sglang extra is missing from the installed metadata"
    for req in sglang:  # each is conditional on the extra: a core install never sees it
        assert req.marker is not None
        assert req.marker.evaluate({"extra": "sglang"})
        assert not req.marker.evaluate({"extra": ""})
        assert not req.marker.evaluate({"extra": "dev"})


@pytest.mark.skipif(sys.version_info < (3, 11), reason="reads pyproject.toml with tomllib")
def test_a_perf_box_gets_only_what_running_perf_tests_needs() -> None:
    """``perf`` (and ``gpu``) resolve, through the extras they name, to no linter, type
    checker or plotting package; ``dev`` still holds everything ``.ci/run`` needs."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def resolve(extra: str) -> set[str]:
        names: set[str] = set()
        for req in extras[extra]:
            r = Requirement(req)
            if canonicalize_name(r.name) == "pytest-specperf":
                for inner in r.extras:
                    names |= resolve(inner)
            else:
                names.add(canonicalize_name(r.name))
        return names

    heavy = {"mypy", "ruff", "matplotlib", "ruptures", "scipy", "types-pyyaml", "pytest-timeout"}
    assert not (resolve("perf") | resolve("gpu")) & heavy
    assert {"pytest-xdist", "numpy"} <= resolve("perf")
    assert {"mypy", "ruff", "matplotlib", "ruptures", "pytest-timeout", "pytest-xdist"} <= resolve("dev")
