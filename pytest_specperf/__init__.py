"""pytest-specperf: phase-level performance regression tests for speculative decoding."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "brief", "plain_text"]


def plain_text(doc: str | None) -> str:
    """A docstring as command-line help: without reStructuredText's double backticks."""
    return (doc or "").replace("``", "")


def brief(v: Any) -> str:
    """A short description of a value, without building the repr of a big one."""
    if isinstance(v, (dict, list, tuple, set)):
        return f"a {type(v).__name__} of {len(v)} item(s)"
    if isinstance(v, str):
        return repr(v[:60]) + ("..." if len(v) > 60 else "")
    return repr(v)[:60]
