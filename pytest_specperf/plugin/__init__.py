"""The pytest wing (``pytest11`` entry point ``specperf``): hooks and fixtures.

The only part of pytest-specperf that imports pytest. pytest registers this module; the
hooks live in ``hooks``, the fixtures in ``fixtures``.
"""

from pytest_specperf.plugin.fixtures import (
    fragmented_kv,
    model_server,
    specperf,
    warmed_cuda_graphs,
)
from pytest_specperf.plugin.hooks import (
    pytest_addoption,
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_call,
    pytest_runtest_setup,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_testnodedown,
    pytest_xdist_node_collection_finished,
)

__all__ = [
    "fragmented_kv",
    "model_server",
    "pytest_addoption",
    "pytest_collection_finish",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_runtest_call",
    "pytest_runtest_setup",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
    "pytest_testnodedown",
    "pytest_xdist_node_collection_finished",
    "specperf",
    "warmed_cuda_graphs",
]
