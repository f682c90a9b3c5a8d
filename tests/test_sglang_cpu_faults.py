"""The faults live CPU SGLang showed (issue 29, item 4), as unit tests of the parts that had
them; ``tests/test_sglang_live.py`` checks each against a real server."""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_specperf.engines.sglang import launcher, sgl_plugin
from pytest_specperf.engines.sglang.hooks import ProbeRuntime

TIMER = launcher.DEVICE_TIMER_ENV


@pytest.mark.parametrize(
    ("args", "env", "timer"),
    [
        ((), {}, "1"),  # SGLang picks the device: a GPU box
        (("--device", "cuda"), {}, "1"),
        (("--device=cpu",), {}, None),  # torch.cpu.Event takes no enable_timing
        ((), {"SGLANG_USE_CPU_ENGINE": "1"}, None),
        (("--device", "npu"), {}, None),
        ((), {TIMER: "0"}, None),  # the caller's own choice is kept (inherited, not added)
    ],
)
def test_unit_device_timer_only_for_cuda_servers(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], timer: str | None
) -> None:
    assert launcher.build_env(tmp_path, env, list(args)).get(TIMER) == timer


def test_unit_signature_read_through_functools_wraps() -> None:
    """SGLang's ``@scheduler_stage_method`` wraps ``Scheduler.on_idle`` with
    ``functools.wraps``: the wrapper's ``(self, *args, **kwargs)`` is not a changed
    signature, the wrapped ``(self)`` is what the map's ``params`` describe."""

    def stage(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            return fn(self, *args, **kwargs)

        return wrapper

    class Scheduler:
        @stage
        def on_idle(self) -> None:
            pass

    assert sgl_plugin.runtime_params(Scheduler.on_idle) == ("self",)


def test_unit_probe_device_is_the_servers() -> None:
    ctx = {"server_args": SimpleNamespace(device="cpu")}
    assert sgl_plugin._device(ctx) == "cpu"
    assert sgl_plugin._device({"server_args": SimpleNamespace(device="cuda")}) == "cuda"
    assert sgl_plugin._device({"server_args": None}) == "cuda"


class _Req:
    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.kv = SimpleNamespace(req_pool_idx=0, kv_committed_len=4)

    def finished(self) -> bool:
        return True


def test_unit_no_fragmentation_file_for_sglang_health_checks(tmp_path: Path) -> None:
    import torch

    rt = ProbeRuntime(tmp_path, use_cuda=False)
    rt.kv_layout = {"id": "x", "layout": "fragmented", "level": 1.0, "seed": 1}
    cache = SimpleNamespace(
        req_to_token_pool=SimpleNamespace(req_to_token=torch.arange(8).reshape(1, 8)),
        page_size=1,
    )
    rt.on_release(_Req("HEALTH_CHECK_0d1f"), cache)
    rt.on_release(_Req("user-1"), cache)
    names = sorted(p.name for p in tmp_path.glob("kvfrag-*"))
    assert len(names) == 1 and "user-1" in names[0], names


class _BusyThenIdleClient:
    """Test double of the server: refuses /flush_cache ``busy`` times (SGLang still finishing
    its health-check request), then flushes."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.flushes = 0

    def flush_cache(self) -> None:
        from pytest_specperf.server.client import ServerHTTPError

        self.flushes += 1
        if self.flushes <= self.busy:
            raise ServerHTTPError("POST", "/flush_cache", 400, "Flush cache failed.")


def test_unit_a_refused_flush_is_retried_until_the_server_is_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_specperf.engines.sglang import kv_fragment
    from pytest_specperf.engines.sglang.backend import SGLangBackend

    monkeypatch.setattr(kv_fragment, "wait_layout_results", lambda rd, rid, timeout_s: [{}])
    monkeypatch.setattr(kv_fragment, "read_layout_results", lambda rd, rid: [{"status": "ok"}])
    b = SGLangBackend()
    b.bind(tmp_path)
    client = _BusyThenIdleClient(busy=2)
    b.set_kv_layout(client, "fragmented", 0.5, 0)  # type: ignore[arg-type]
    assert client.flushes == 3
    b.flush_wait_s = 0.3
    with pytest.raises(kv_fragment.KVLayoutError, match=r"refused .* for 0\.3 s: the server"):
        b.set_kv_layout(_BusyThenIdleClient(busy=100), "fragmented", 0.5, 0)  # type: ignore[arg-type]
