"""Every install line a message gives works without a package index: it names where this
copy came from (pip's PEP 610 ``direct_url.json``): a git URL at its revision, the
checkout (editable or not), or the wheel file."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specperf.install import install_hint, install_line


@pytest.mark.parametrize(
    ("direct_url", "extra", "line"),
    [
        (
            {"url": "https://github.com/acme/pytest-specperf",
             "vcs_info": {"vcs": "git", "requested_revision": "v0.1.0", "commit_id": "abc123"}},
            "sglang",
            'pip install "pytest-specperf[sglang] @ git+https://github.com/acme/pytest-specperf@v0.1.0"',
        ),
        (
            {"url": "https://github.com/acme/pytest-specperf",
             "vcs_info": {"vcs": "git", "commit_id": "abc123"}},
            None,
            'pip install "pytest-specperf @ git+https://github.com/acme/pytest-specperf@abc123"',
        ),
        (
            {"url": "file:///src/pytest-specperf", "dir_info": {"editable": True}},
            "gpu",
            'pip install -e "/src/pytest-specperf[gpu]"',
        ),
        (
            {"url": "file:///src/pytest-specperf", "dir_info": {}},
            "history",
            'pip install "/src/pytest-specperf[history]"',
        ),
        (
            {"url": "file:///wheels/pytest_specperf-0.1.0-py3-none-any.whl",
             "archive_info": {}},
            "perf",
            'pip install "pytest-specperf[perf] @ file:///wheels/pytest_specperf-0.1.0-py3-none-any.whl"',
        ),
    ],
)  # fmt: skip
def test_the_line_names_the_source_pip_recorded(direct_url, extra, line) -> None:
    assert install_line(extra, direct_url) == line


def test_without_a_record_a_checkout_installs_from_its_folder() -> None:
    line = install_line("sglang", None)
    # this test runs from a checkout (pyproject.toml beside the package)
    assert line.startswith('pip install -e "') and line.endswith('[sglang]"')


def test_this_copy_names_its_checkout() -> None:
    # the test environments (the venvs, .ci/run) hold an editable install of the checkout
    root = Path(__file__).resolve().parents[1]
    assert install_hint("sglang") == f'pip install -e "{root}[sglang]"'
