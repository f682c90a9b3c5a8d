"""Shared fixtures of the plugin's own test suite."""

from __future__ import annotations

import contextlib

import pytest

pytest_plugins = ["pytester"]

# pytester's in-process runs restore sys.modules afterwards, and torch cannot be imported
# twice in one process: import it once, up front, so that inline runs find it loaded.
with contextlib.suppress(ImportError):
    import torch  # noqa: F401


@pytest.fixture(scope="session")
def tiny_engine_factory():
    """Build reference engines on the CPU, cached per (algorithm, block, simulate) key."""
    from pytest_specperf.engines.reference.config import get_config
    from pytest_specperf.engines.reference.engine import Engine

    cache = {}

    def make(algorithm="DFLASH", block=8, simulate=None, probe=None):
        key = (algorithm, block, simulate, id(probe))
        if key not in cache:
            cache[key] = Engine(
                get_config("tiny"),
                algorithm=algorithm,
                num_draft_tokens=block,
                simulate_accept_len=simulate,
                probe=probe,
            )
        return cache[key]

    return make
