"""Backends: the registry that picks one by name.

Built-in backends are ``reference`` (the embedded engine) and ``sglang``. Other packages
add backends through the entry-point group ``pytest_specperf.backends`` (name ->
``module:Class``). The protocol (``server.protocol``) imports no implementation; this
registry imports one only when it is asked for.
"""

from __future__ import annotations

import importlib
from typing import Final

from pytest_specperf.server.protocol import Backend, BackendUnavailable

#: Entry-point group of third-party backends.
ENTRY_POINT_GROUP: Final = "pytest_specperf.backends"
_BUILTIN: Final[dict[str, str]] = {
    "reference": "pytest_specperf.engines.reference.backend:ReferenceBackend",
    "sglang": "pytest_specperf.engines.sglang.backend:SGLangBackend",
}


def _registered() -> dict[str, str]:
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return {**found, **_BUILTIN}  # a plugin cannot shadow a built-in backend


def backend_names() -> tuple[str, ...]:
    """Every backend name that ``get_backend`` accepts, built-ins first."""
    extra = sorted(set(_registered()) - set(_BUILTIN))
    return (*_BUILTIN, *extra)


def get_backend(name: str) -> Backend:
    """A new, unbound backend called ``name``; ``ValueError`` for an unknown name."""
    target = _registered().get(name)
    if target is None:
        raise ValueError(f"unknown backend {name!r}; choose one of: {', '.join(backend_names())}")
    module, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise BackendUnavailable(f"backend {name!r} ({target}) cannot be loaded: {e}") from None
    backend: Backend = cls()
    return backend


__all__ = ["ENTRY_POINT_GROUP", "Backend", "BackendUnavailable", "backend_names", "get_backend"]
