"""pytest-specperf: phase-level performance regression tests for speculative decoding."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
