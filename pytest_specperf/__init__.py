"""pytest-specperf: phase-level performance regression tests for speculative decoding."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__", "plain_text"]


def plain_text(doc: str | None) -> str:
    """A docstring as command-line help: without reStructuredText's double backticks."""
    return (doc or "").replace("``", "")
