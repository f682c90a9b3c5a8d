"""Start-up shims for real SGLang on a CPU without AMX (live tests only; test support).

Python imports ``sitecustomize`` at start-up from ``sys.path``; the live tests put this
directory on ``PYTHONPATH`` of the SGLang server they start (and of a pytest that launches
one), together with the stand-in ``sgl_kernel`` beside it. Nothing is imported here at
start-up: two import hooks act when their module is imported, in every process of the
server (launcher, tokenizer, schedulers):

- ``torchvision``: the only torchvision 0.28.0 wheel is a CUDA build whose ``_C`` cannot
  load against CPU torch; torchvision then fails at import with ``operator torchvision::nms
  does not exist`` (its meta registrations need the schemas). The hook defines the
  ``torchvision::nms`` and ``torchvision::qnms`` schemas first (no kernel behind them:
  nothing in a text-only server calls them).
- ``sglang.srt.runtime_context``: sets SGLang's platform fact ``has_amx`` to true, the one
  way through SGLang's check that a speculative draft runs on the ``intel_amx`` attention
  backend (the only CPU backend with a multi-step draft). The attention it then calls is the
  stand-in's plain torch (``torch.ops.sgl_kernel.*_attention_cpu``); no AMX instruction runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


def _torchvision_schemas() -> None:
    import torch

    try:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define(
            "qnms(Tensor dets, Tensor scores, float iou_threshold, float scale, int zero_point)"
            " -> Tensor"
        )
    except RuntimeError:
        return  # defined already (a working torchvision build, or imported twice)
    _keep.append(lib)


def _platform_has_amx(module: ModuleType) -> None:
    module.override_platform(has_amx=True).install()


_keep: list[Any] = []
_BEFORE: dict[str, Callable[[], None]] = {"torchvision": _torchvision_schemas}
_AFTER: dict[str, Callable[[ModuleType], None]] = {"sglang.srt.runtime_context": _platform_has_amx}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        before = _BEFORE.get(self._name)
        if before is not None:
            before()
        self._inner.exec_module(module)
        after = _AFTER.get(self._name)
        if after is not None:
            after(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _BEFORE and fullname not in _AFTER:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


sys.meta_path.insert(0, _Finder())
