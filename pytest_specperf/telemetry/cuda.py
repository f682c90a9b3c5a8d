"""Whether a CUDA device is usable here, without importing torch when it is absent."""

from __future__ import annotations

import importlib.util


def cuda_unavailable_reason() -> str | None:
    """``None`` when CUDA is usable, else a one-line reason."""
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed"
    from pytest_specperf.telemetry.loader import import_torch

    torch = import_torch()  # Ctrl-C held while it imports
    if torch is None:
        return "PyTorch failed to import"
    if not torch.cuda.is_available():
        build = "a CPU-only PyTorch build" if torch.version.cuda is None else "no visible device"
        return f"torch.cuda.is_available() is False ({build})"
    return None
