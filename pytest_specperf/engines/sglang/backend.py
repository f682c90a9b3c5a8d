"""The ``sglang`` backend: a real SGLang server, probed from inside its schedulers.

Everything here runs in the pytest process and never imports SGLang (its source is read
with ``ast`` where needed, see :mod:`.source`). Inside the server, our code arrives
through SGLang's plugin entry point (:mod:`.sgl_plugin`), turned on by the environment
this backend puts into the launch spec.

Attach mode (``--specperf-attach URL``): start the server yourself with the same
environment, for example::

    SPECPERF_SGLANG_PLUGIN=1 SPECPERF_RUN_DIR=/tmp/specperf-run \\
    SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 \\
    python -m sglang.launch_server --model-path M --speculative-algorithm EAGLE3 \\
        --speculative-draft-model-path D --enable-metrics --port 30000

and run pytest with ``SPECPERF_RUN_DIR=/tmp/specperf-run`` in its environment too. The
server and pytest must share that directory (same machine or a shared filesystem).
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_specperf.engines.env import (
    ENV_PHASE_MAP,
    ENV_RUN_DIR,
    ENV_SGLANG_PLUGIN,
    probe_env,
)
from pytest_specperf.engines.sglang import (
    algorithms,
    kv_fragment,
    kv_size,
    launcher,
    metrics,
    preflight,
    source,
)
from pytest_specperf.install import install_hint
from pytest_specperf.probe.phases import PHASES
from pytest_specperf.probe.record import StepRecord
from pytest_specperf.server.client import ServerClient, ServerHTTPError, ServerUnreachable
from pytest_specperf.server.protocol import (
    BackendSettings,
    BackendUnavailable,
    LaunchSpec,
    RunDirBinding,
)

#: The entry point SGLang's load_plugins() discovers (declared in pyproject.toml).
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_VALUE = "pytest_specperf.engines.sglang.sgl_plugin:load"
#: Prompt token ids when the vocabulary size is unknown: ordinary tokens in every
#: tokenizer with at least 32k entries (Llama 2/3, Mistral, Qwen 2/3, DeepSeek, GPT-NeoX).
DEFAULT_ID_RANGE = (1000, 30000)
#: Decode tokens of room a case needs beyond its context (as the reference backend).
CAPACITY_ROOM = 512
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_FINGERPRINT_KEYS = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_dflash_block_size",
    "load_format",
    "speculative_draft_load_format",
    "dtype",
    "kv_cache_dtype",
    "quantization",
    "page_size",
    "tp_size",
    "pp_size",
    "dp_size",
    "attention_backend",
    "cuda_graph_max_bs_decode",
    "disable_radix_cache",
)


def check_model(value: str, option: str) -> None:
    """A local model path must exist (a directory needs config.json); HF ids pass."""
    path = Path(value).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").is_file():
            raise BackendUnavailable(
                f"{option} {value!r}: {path} has no config.json; SGLang needs a Hugging Face "
                "model directory (config.json and tokenizer files; weights too unless "
                "--specperf-server-arg=--load-format=dummy)"
            )
        return
    looks_like_path = (
        value.startswith(("/", "./", "../", "~", "\\"))
        or value.count("/") > 1
        or "\\" in value
        or value.endswith("/")
    )
    if looks_like_path:
        raise BackendUnavailable(f"{option} {value!r}: no such file or directory")
    if not _HF_ID.match(value):
        raise BackendUnavailable(
            f"{option} {value!r} is neither an existing path nor a Hugging Face repo id (org/name)"
        )


def _hf_cache_dirs() -> list[Path]:
    out = []
    if os.environ.get("HF_HUB_CACHE"):
        out.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        out.append(Path(os.environ["HF_HOME"]) / "hub")
    out.append(Path.home() / ".cache" / "huggingface" / "hub")
    return out


def read_model_config(model: str) -> dict[str, Any] | None:
    """The model's config.json (a local directory, or the HF cache for a repo id), if found."""
    path = Path(model).expanduser()
    candidates: list[Path] = []
    if path.is_dir():
        candidates.append(path / "config.json")
    elif _HF_ID.match(model) and "/" in model:
        org, name = model.split("/", 1)
        for cache in _hf_cache_dirs():
            candidates.extend(sorted(cache.glob(f"models--{org}--{name}/snapshots/*/config.json")))
    for cfg in candidates:
        try:
            data = json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def config_vocab_size(model: str) -> int | None:
    """``vocab_size`` from the model's config.json (local dir or the HF cache), if found."""
    data = read_model_config(model) if model else None
    if data is None:
        return None
    for holder in (data, data.get("text_config"), data.get("llm_config")):
        if isinstance(holder, dict) and isinstance(holder.get("vocab_size"), int):
            return int(holder["vocab_size"])
    return None


def prompt_id_range(vocab_size: int | None) -> tuple[int, int]:
    """Token ids ``[lo, hi)`` for synthetic prompts.

    Known vocabulary: skip the first ``min(1000, vocab/8)`` ids (byte and control tokens
    at the start of many vocabularies) and the last ``max(256, vocab/32)`` (special tokens
    and padding at the end of others). Unknown: :data:`DEFAULT_ID_RANGE`.
    """
    if vocab_size is None:
        return DEFAULT_ID_RANGE
    if vocab_size < 16:
        raise BackendUnavailable(f"vocabulary of {vocab_size} tokens is too small for prompts")
    lo = min(1000, vocab_size // 8)
    hi = vocab_size - max(256, vocab_size // 32) if vocab_size > 1024 else vocab_size - 1
    return lo, max(hi, lo + 1)


class SGLangBackend(RunDirBinding):
    """Real SGLang, launched as ``python -m sglang.launch_server`` (or attached to)."""

    name = "sglang"
    server_info_fields = ("model_path", "version")
    #: How long a refused /flush_cache (server not idle yet) is retried.
    flush_wait_s = 10.0

    def __init__(self) -> None:
        self._vocab_size: int | None = None
        self._version: str | None = None
        self._layout_requested = False
        # the hook-call counts when the last measured window began, and each required
        # target's calls over that window (``target_calls``)
        self._calls_before: dict[str, int] | None = None
        self._window_calls: dict[tuple[str, str], int] | None = None

    # -- before launch -------------------------------------------------------------------
    def check(self, settings: BackendSettings) -> None:
        root = source.sglang_root()
        if root is None:
            raise BackendUnavailable(
                f"the sglang backend needs SGLang, which is not installed here; install it "
                f"with: {install_hint('sglang')} (serving needs a CUDA GPU; your own SGLang build "
                "or fork instead: install it, then the plugin without the extra)"
            )
        self._version = source.installed_version()
        if not settings.model:
            raise BackendUnavailable(
                "the sglang backend needs a model: --specperf-model PATH_OR_HF_ID (a local "
                "Hugging Face model directory or a repo id)"
            )
        check_model(settings.model, "--specperf-model")
        if settings.draft_model:
            check_model(settings.draft_model, "--specperf-draft-model")
        tokens = launcher.split_server_args(settings.server_args)
        launcher.check_server_args(tokens, launcher.known_flags(root), self._version)
        if not launcher.has_flag(tokens, "--speculative-algorithm", "--config"):
            raise BackendUnavailable(
                "the sglang backend measures speculative decoding: pass the algorithm, e.g. "
                "--specperf-server-arg=--speculative-algorithm=EAGLE3 (or DFLASH, NEXTN, "
                "EAGLE, STANDALONE, FROZEN_KV_MTP)"
            )
        if not _entry_point_installed():
            raise BackendUnavailable(
                f"SGLang loads our in-server probe through the entry point "
                f"{ENTRY_POINT_GROUP}:specperf of the installed pytest-specperf distribution, "
                f"which is missing: install the plugin with pip ({install_hint()}), not only "
                "on PYTHONPATH"
            )
        algo = launcher.flag_value(tokens, "--speculative-algorithm") or launcher.config_value(
            tokens, "speculative_algorithm"
        )
        # as SGLang resolves it: EAGLE/NEXTN with a Gemma4 assistant draft is FROZEN_KV_MTP
        draft_cfg = read_model_config(settings.draft_model) if settings.draft_model else None
        algo = preflight.resolved_algorithm(algo, draft_cfg)
        self._check_algorithm(algo, self._version)  # None (set in a config file): at attach
        if algo is None or algo.upper() != "NONE":
            self._check_map(root, algo)
        sizes = [
            v
            for v in (
                config_vocab_size(settings.model),
                config_vocab_size(settings.draft_model or ""),
            )
            if v
        ]
        self._vocab_size = min(sizes) if sizes else None

    def _check_algorithm(self, algorithm: str | None, version: str | None) -> None:
        """Refuse a bad ``SPECPERF_PHASE_MAP`` and an algorithm without a step entry."""
        from pytest_specperf.engines.sglang.phase_map import PhaseMapError, load_effective

        try:
            pm = load_effective(version, os.environ.get(ENV_PHASE_MAP) or None)
        except PhaseMapError as e:
            raise BackendUnavailable(f"{ENV_PHASE_MAP}: {e}") from None
        if algorithm and algorithm.upper() != "NONE":
            reason = algorithms.refusal(algorithm, pm, version)
            if reason is not None:
                raise BackendUnavailable(reason)

    def _check_map(self, root: Path, algorithm: str | None) -> None:
        """The map's required targets and signatures against the installed source."""
        from pytest_specperf.engines.sglang.phase_map import PhaseMapError

        try:
            preflight.check_map(
                root, self._version, algorithm, os.environ, os.environ.get(ENV_PHASE_MAP) or None
            )
        except preflight.MapMismatch as e:
            raise BackendUnavailable(str(e)) from None
        except PhaseMapError as e:
            raise BackendUnavailable(f"{ENV_PHASE_MAP}: {e}") from None

    def check_attached(self, server_info: dict[str, Any]) -> None:
        """At attach (and once a launched server answers): its algorithm must be mapped."""
        algo = server_info.get("speculative_algorithm")
        version = server_info.get("version")
        self._check_algorithm(
            algo if isinstance(algo, str) else None,
            version if isinstance(version, str) else self._version,
        )

    def launch_spec(self, settings: BackendSettings, *, port: int, run_dir: Path) -> LaunchSpec:
        if not settings.model:
            raise BackendUnavailable("the sglang backend needs --specperf-model")
        tokens = launcher.split_server_args(settings.server_args)
        cmd = launcher.build_command(
            settings.python or sys.executable,
            model=_model_arg(settings.model),
            draft_model=_model_arg(settings.draft_model) if settings.draft_model else None,
            port=port,
            server_args=tokens,
        )
        self.bind(run_dir)
        env = launcher.build_env(self.run_dir, os.environ, tokens)
        # the scheduler's probe: canary slowdowns, NVTX ranges, kernel sampling
        env.update(
            probe_env(
                inject=settings.inject, nvtx=settings.nvtx, kernel_every=settings.kernel_every
            )
        )
        return LaunchSpec(cmd=cmd, env=env, ready_deadline_s=1200.0, name="sglang server")

    # -- per case --------------------------------------------------------------------------
    def prompt_fields(self, context_len: int, batch_size: int, seed: int) -> dict[str, Any]:
        """``input_ids`` of ``context_len`` seeded random tokens per request.

        Ids come from :func:`prompt_id_range` of the vocabulary size read from the model's
        config.json at ``check()`` (local path, or the Hugging Face cache for a repo id);
        without it, from :data:`DEFAULT_ID_RANGE`. Request ``i`` of a batch uses seed
        ``seed + i``; a batch is a list of lists.
        """
        if context_len < 1:
            raise ValueError(f"context_len must be at least 1, got {context_len}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        lo, hi = prompt_id_range(self._vocab_size)
        ids = range(lo, hi)
        rows = [random.Random(seed + i).choices(ids, k=context_len) for i in range(batch_size)]
        return {"input_ids": rows[0] if batch_size == 1 else rows}

    def step_limit_fields(self, server_info: dict[str, Any], steps: int) -> dict[str, Any]:
        """No fields: SGLang ends a request on its tokens only (a block runs a few steps past
        the wanted ones, which on a GPU cost milliseconds)."""
        return {}

    def set_kv_layout(self, client: ServerClient, layout: str, level: float, seed: int) -> None:
        rd = self.run_dir
        if layout == "contiguous":
            level = 0.0
        try:
            request_id = kv_fragment.write_request(rd, layout, level, seed)
        except ValueError as e:
            raise kv_fragment.KVLayoutError(str(e)) from None
        self._layout_requested = True
        # SGLang flushes only when fully idle: right after a request (or its own health
        # check, which /health_generate runs through the scheduler) it may still be
        # finishing that batch, so a refusal is retried for up to flush_wait_s
        deadline = time.monotonic() + self.flush_wait_s
        while True:
            try:
                client.flush_cache()
                break
            except ServerHTTPError as e:
                if time.monotonic() >= deadline:
                    raise kv_fragment.KVLayoutError(
                        f"/flush_cache was refused ({e.message.strip()}) for "
                        f"{self.flush_wait_s:g} s: the server must be idle to lay out its "
                        "KV cache"
                    ) from None
                time.sleep(0.2)
        results = kv_fragment.wait_layout_results(rd, request_id, timeout_s=10.0)
        if not results:
            raise kv_fragment.KVLayoutError(
                f"the server flushed its cache but applied no KV layout within 10 s: is the "
                f"pytest-specperf SGLang plugin loaded? It needs {ENV_SGLANG_PLUGIN}=1 and "
                f"{ENV_RUN_DIR}={rd} in the server's environment; see hooks-*.json in {rd} "
                "and 'pytest-specperf' lines in the server log"
            )
        time.sleep(0.2)  # other tensor-parallel ranks report at about the same time
        results = kv_fragment.read_layout_results(rd, request_id) or results
        bad = [r for r in results if r.get("status") != "ok"]
        if bad:
            raise kv_fragment.KVLayoutError(
                f"the SGLang server refused KV layout {layout!r} (level {level}): "
                f"{bad[0].get('message')}"
            )

    def kv_fragmentation(self, meta_info: dict[str, Any]) -> float | None:
        rid = meta_info.get("id")
        rd = self.run_dir
        if not isinstance(rid, str):
            return None
        # Written by the scheduler before it streams the final output; the wait only
        # covers a slow filesystem.
        deadline = time.monotonic() + (2.0 if self._layout_requested else 0.0)
        while True:
            data = kv_fragment.read_fragmentation(rd, rid)
            if data is not None:
                value = data.get("fragmentation")
                return float(value) if isinstance(value, (int, float)) else None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def fingerprint(self, server_info: dict[str, Any]) -> dict[str, Any]:
        if "model_path" not in server_info:
            raise BackendUnavailable(
                "/server_info has no model_path: the server is not an SGLang server"
            )
        self.check_attached(server_info)
        from pytest_specperf.engines.sglang.phase_map import builtin_name_for

        if self._vocab_size is None:  # attach mode: check() was not called
            paths = [server_info.get("model_path"), server_info.get("speculative_draft_model_path")]
            sizes = [v for v in (config_vocab_size(p) for p in paths if isinstance(p, str)) if v]
            self._vocab_size = min(sizes) if sizes else None
        version = server_info.get("version")
        fp: dict[str, Any] = {
            "backend": "sglang",
            "version": version,
            "model": server_info.get("model_path"),
            "draft_model": server_info.get("speculative_draft_model_path"),
            "phase_map": builtin_name_for(version if isinstance(version, str) else None),
        }
        for key in _FINGERPRINT_KEYS:
            fp[key] = server_info.get(key)
        fp["cuda_graphs"] = decode_cuda_graphs(server_info)
        return fp

    def reference_ms(self, meta_info: dict[str, Any]) -> float | None:
        return None  # no reference read inside SGLang: step times are judged raw

    def kv_bytes_per_token(self, server_info: dict[str, Any]) -> float | None:
        """KV bytes per context token one GPU reads, from the served model's config.json
        (``model_path`` of ``/server_info``: a local directory or the HF cache) and the
        server's ``kv_cache_dtype``, ``dtype`` and ``tp_size`` (see :mod:`.kv_size`).
        None where the config is not readable here (a remote attached server)."""
        model = server_info.get("model_path")
        config = read_model_config(model) if isinstance(model, str) and model else None
        if config is None:
            return None
        return kv_size.kv_bytes_per_token(
            config,
            kv_cache_dtype=str(server_info.get("kv_cache_dtype") or "auto"),
            dtype=str(server_info.get("dtype") or "auto"),
            tp_size=_int(server_info.get("tp_size")) or 1,
        )

    def mapped_phases(self, server_info: dict[str, Any]) -> frozenset[str] | None:
        """The phases of the hooks the schedulers report installed (``hooks-*.json``),
        required ones only: an optional hook may not exist in this build. None before a
        scheduler reported."""
        reports = self.hook_reports()
        if not reports:
            return None
        return frozenset(
            str(h["phase"])
            for r in reports
            for h in r.get("installed", [])
            if isinstance(h, dict)
            and h.get("role") in ("phase", "iteration")
            and h.get("phase") in PHASES
            and not h.get("optional")
        )

    def required_targets(self) -> dict[str, str]:
        """The installed phase and iteration targets that must time something in every
        measured window (``optional`` ones and those the map marks ``may_not_fire``
        excepted), with their phase."""
        return {
            str(h["target"]): str(h["phase"])
            for r in self.hook_reports()
            for h in r.get("installed", [])
            if isinstance(h, dict)
            and h.get("role") in ("phase", "iteration")
            and h.get("phase") in PHASES
            and not h.get("optional")
            and not h.get("may_not_fire")
        }

    def hook_calls(self) -> dict[str, int] | None:
        """Calls each phase/iteration target timed inside a step so far, summed over the
        schedulers (``calls-*.json``, written at every flush); None when none wrote one."""
        total: dict[str, int] = {}
        found = False
        for path in sorted(self.run_dir.glob("calls-*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            calls = data.get("calls") if isinstance(data, dict) else None
            if not isinstance(calls, dict):
                continue
            found = True
            for target, n in calls.items():
                if isinstance(n, int) and not isinstance(n, bool):
                    total[str(target)] = total.get(str(target), 0) + n
        return total if found else None

    def target_calls(self, server_info: dict[str, Any]) -> dict[tuple[str, str], int] | None:
        """Each required target (with its phase) and the calls it timed during the last
        measured window (``metrics_before`` to ``metrics_check``); None when the schedulers
        report no counts. ``--specperf-strict`` fails a case where one of them is 0."""
        return self._window_calls

    def notes(self) -> list[str]:
        return self.describe_hooks()

    def metrics_before(self, client: ServerClient) -> Any:
        self._calls_before = self.hook_calls()
        self._window_calls = None
        try:
            return metrics.scrape(client)
        except (metrics.MetricsParseError, ServerHTTPError, ServerUnreachable):
            return None

    def metrics_check(
        self, client: ServerClient, before: Any, records: Sequence[StepRecord], wall_s: float
    ) -> list[str]:
        calls = self.hook_calls()
        if calls is not None:
            was = self._calls_before or {}
            self._window_calls = {
                (target, phase): calls.get(target, 0) - was.get(target, 0)
                for target, phase in self.required_targets().items()
            }
        if before is None:
            return ["sglang metrics unavailable (start the server with --enable-metrics)"]
        try:
            after = metrics.scrape(client)
        except (metrics.MetricsParseError, ServerHTTPError, ServerUnreachable) as e:
            return [f"sglang metrics unavailable: {e}"]
        return metrics.cross_check(before, after, records, wall_s=wall_s)

    def start_profile(self, client: ServerClient, trace: Path) -> None:
        """SGLang's own profiler endpoint (torch.profiler in every scheduler)."""
        trace.mkdir(parents=True, exist_ok=True)
        client.post(
            "/start_profile", {"output_dir": str(trace.resolve()), "activities": ["CPU", "GPU"]}
        )

    def stop_profile(self, client: ServerClient, trace: Path) -> list[Path]:
        client.post("/stop_profile", {})
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:  # the schedulers write their traces after stop
            files = sorted(p for p in trace.glob("*") if p.is_file())
            if files:
                return files
            time.sleep(0.5)
        return []

    def capacity_reason(
        self, server_info: dict[str, Any], context_len: int, batch_size: int
    ) -> str | None:
        """Why ``batch_size`` requests of ``context_len`` tokens cannot run on this server.

        From SGLang's own limits in ``/server_info``: ``context_length`` (prompt plus
        output), ``max_req_input_len`` and ``max_total_num_tokens`` (the KV pool), with
        room for ``CAPACITY_ROOM`` decode tokens plus one draft block per request.
        """
        block = _int(server_info.get("speculative_num_draft_tokens")) or 1
        need = context_len + CAPACITY_ROOM + block
        limit = _int(server_info.get("context_length"))
        if limit and need > limit:
            return (
                f"context {context_len} + {CAPACITY_ROOM + block} decode tokens exceeds the "
                f"model's context length of {limit} tokens on this server"
            )
        max_input = _int(server_info.get("max_req_input_len"))
        if max_input and context_len > max_input:
            return (
                f"context {context_len} exceeds the server's max_req_input_len of "
                f"{max_input} tokens"
            )
        pool = _int(server_info.get("max_total_num_tokens"))
        if pool and batch_size * need > pool:
            return (
                f"{batch_size} x {need} tokens of KV do not fit in the server's KV pool of "
                f"{pool} tokens (max_total_num_tokens)"
            )
        return None

    # -- reports (not part of the Backend protocol) ---------------------------------------
    def hook_reports(self) -> list[dict[str, Any]]:
        """The schedulers' hook reports (``hooks-*.json``), one per scheduler process."""
        out = []
        for path in sorted(self.run_dir.glob("hooks-*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                out.append(data)
        return out

    def describe_hooks(self) -> list[str]:
        """Readable lines about hooks missing or changed, and hook errors, for reports."""
        reports = self.hook_reports()
        if not reports:
            return [
                "sglang: no hook report in the run directory: the pytest-specperf plugin "
                "did not load in any scheduler (no phase timings will be recorded)"
            ]
        r = reports[0]
        lines = [
            f"sglang {r.get('sglang_version')}: {len(r.get('installed', []))} hooks "
            f"installed from {', '.join(r.get('phase_map', []))}"
        ]
        if r.get("refused"):
            lines.append(f"  REFUSED, nothing installed: {r['refused']}")
        for m in r.get("missing", []):
            kind = "optional target" if m.get("optional") else "MISSING target"
            if m.get("kind") == "import_failed":
                kind = "IMPORT FAILED for target"
            lines.append(
                f"  {kind} {m['target']} ({m.get('phase') or m['role']}): {m.get('reason', '')}"
            )
        for c in r.get("signature_changed", []):
            lines.append(
                f"  signature changed: {c['target']}: expected {c['expected']}, found {c['actual']}"
            )
        if r.get("phase_map_error") and not r.get("refused"):
            lines.append(f"  {r['phase_map_error']}")
        for path in sorted(self.run_dir.glob("errors-*.json")):
            try:
                errors = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            for where, e in errors.items():
                lines.append(f"  hook error in {where} ({e.get('count')}x): {e.get('first')}")
        return lines


def decode_cuda_graphs(server_info: dict[str, Any]) -> bool:
    """Whether the server captures CUDA graphs for decode (from its resolved arguments)."""
    if server_info.get("disable_cuda_graph"):
        return False
    if server_info.get("cuda_graph_backend_decode") == "disabled":
        return False
    cfg = server_info.get("cuda_graph_config")
    if isinstance(cfg, dict):
        decode = cfg.get("decode")
        if isinstance(decode, dict) and decode.get("backend") == "disabled":
            return False
    return True


def _int(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _model_arg(model: str) -> str:
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def _entry_point_installed() -> bool:
    from importlib.metadata import entry_points

    return any(
        ep.name == "specperf" and ep.value.replace(" ", "") == ENTRY_POINT_VALUE
        for ep in entry_points(group=ENTRY_POINT_GROUP)
    )
