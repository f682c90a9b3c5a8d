"""Lazy, warning-safe imports of ``pynvml`` (nvidia-ml-py) and ``torch``.

Two distributions install a module named ``pynvml``: NVIDIA's ``nvidia-ml-py`` (the one we
want) and the older community ``pynvml`` package, whose recent releases are a shim that emits
``FutureWarning: The pynvml package is deprecated. Please install nvidia-ml-py instead ...``
on import. Under ``pytest -W error`` that warning would become an exception inside the
import, so every import of ``pynvml`` made by this package goes through
:func:`load_pynvml`, which imports it under ``warnings.catch_warnings()`` with
``FutureWarning`` and ``DeprecationWarning`` ignored *for the duration of that import only*.

``torch.cuda`` itself imports ``pynvml`` when it is installed, so :func:`import_torch` also
imports torch under a filter that ignores that one message (matched by text, so torch's own
warnings are left alone).

torch's import does not survive a ``KeyboardInterrupt`` raised inside it (the process aborts,
or the interrupt is lost), so :func:`import_torch` holds Ctrl-C until the import is done.

Nothing here caches a module in a global: Python's ``sys.modules`` already does, so a second
call is a dictionary lookup. A failed import is retried on every call (cheap, and it lets a
test inject a fake module).
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import threading
import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import NamedTuple

#: Regex (``re.match``, case-insensitive) for the deprecation message of the ``pynvml`` shim.
PYNVML_DEPRECATION_MESSAGE = r".*pynvml package is deprecated"


class PynvmlImport(NamedTuple):
    """Result of :func:`load_pynvml`: the module, or ``None`` and a one-line reason."""

    module: ModuleType | None
    reason: str


def _one_line(text: str) -> str:
    return " ".join(text.split())


def load_pynvml() -> PynvmlImport:
    """Import ``pynvml`` with its deprecation warnings silenced; never raises.

    Returns ``PynvmlImport(module, "")`` on success, else ``PynvmlImport(None, reason)`` where
    ``reason`` is one line saying what failed and what to install. Importing only loads the
    Python bindings: whether the NVML *library* is present is known only at ``nvmlInit()``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            module = importlib.import_module("pynvml")
        except ImportError as exc:
            return PynvmlImport(
                None, _one_line(f"pynvml not importable ({exc}); pip install nvidia-ml-py")
            )
        except Exception as exc:  # a broken install must not break the test run
            return PynvmlImport(
                None, _one_line(f"pynvml import failed: {type(exc).__name__}: {exc}")
            )
    return PynvmlImport(module, "")


def import_pynvml() -> ModuleType | None:
    """The ``pynvml`` module, or ``None`` when it cannot be imported (see :func:`load_pynvml`
    for the reason)."""
    return load_pynvml().module


def import_torch() -> ModuleType | None:
    """Import ``torch`` lazily; ``None`` when it is not installed or fails to import.

    The ``pynvml`` shim's deprecation warning (raised from inside ``torch.cuda``) is ignored
    for the duration of the import so that ``-W error`` runs survive.
    """
    with warnings.catch_warnings(), ctrl_c_deferred():
        warnings.filterwarnings(
            "ignore", message=PYNVML_DEPRECATION_MESSAGE, category=FutureWarning
        )
        try:
            return importlib.import_module("torch")
        except Exception:
            return None


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """Hold Ctrl-C until the block ends, then act on it (a ``KeyboardInterrupt`` right
    after the block). Only on the main thread, where Python runs signal handlers: while the
    block runs, SIGINT is only noted, whichever thread the operating system handed it to."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if noted and old is not signal.SIG_IGN:
            if callable(old):
                old(signal.SIGINT, None)  # Python's default handler raises KeyboardInterrupt
            else:
                raise KeyboardInterrupt


def nvml_error_text(exc: BaseException) -> str:
    """One line for an NVML (or any) exception: ``str(exc)``, else the class name."""
    text = _one_line(str(exc))
    return text or type(exc).__name__


def nvml_error_code(exc: BaseException) -> int | None:
    """The NVML return code carried by a ``pynvml.NVMLError`` (attribute ``value``), else None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def handle_by_uuid(pynvml: ModuleType, uuid: str) -> object:
    """``nvmlDeviceGetHandleByUUID`` across nvidia-ml-py versions.

    Recent bindings take a ``str`` (they encode it); older ones pass the argument straight
    to ``ctypes.c_char_p``, which refuses a ``str`` with a ``TypeError``: those get the
    UUID as ASCII bytes. NVML errors (no such device) propagate unchanged.
    """
    fn = pynvml.nvmlDeviceGetHandleByUUID
    try:
        return fn(uuid)
    except TypeError:
        return fn(uuid.encode("ascii"))
