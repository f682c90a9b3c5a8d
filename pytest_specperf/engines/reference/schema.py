"""Request bodies of the reference server: JSON limits, validation, and response JSON.

Every check raises :class:`HTTPError` with a 4xx status and a message that names the
field, the bad value and what is accepted. Nothing here touches a socket or the engine's
state: ``parse_generate`` only asks the engine to validate a request.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from pytest_specperf.engines.reference.engine import Engine, GenRequest, GenResult, RequestError
from pytest_specperf.engines.reference.kv import LAYOUTS

#: Largest ``max_new_tokens`` accepted in one request.
MAX_NEW_TOKENS_LIMIT = 65536
#: Deepest nesting of arrays and objects accepted in a body (a batch needs 3).
MAX_JSON_DEPTH = 32
#: Longest integer literal accepted (a signed 64-bit integer has at most 20 characters).
MAX_INT_CHARS = 20
#: Longest number literal with a fraction or exponent accepted.
MAX_FLOAT_CHARS = 40
#: Largest seed accepted (a signed 64-bit integer).
MAX_SEED = 2**63 - 1
#: Longest request id accepted.
MAX_RID_CHARS = 200

GENERATE_KEYS = frozenset(
    {
        "input_ids",
        "context_len",
        "sampling_params",
        "rid",
        "synthetic_seed",
        "stream",
        "return_logprob",
        "text",
    }
)
#: ``max_decode_steps`` is this engine's own: the most decode steps a request runs (a
#: measured block ends on its last wanted step whatever the acceptance; SGLang has none)
SAMPLING_KEYS = frozenset({"max_new_tokens", "temperature", "ignore_eos", "max_decode_steps"})
KV_LAYOUT_KEYS = frozenset({"layout", "level", "seed"})
PROFILE_ACTIONS = ("start", "stop")


class HTTPError(Exception):
    """A request the server answers with ``status`` and a JSON error naming the problem.

    ``close``: the connection cannot be reused (the request's framing is unknown).
    """

    def __init__(
        self,
        status: HTTPStatus,
        message: str,
        *,
        close: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close
        self.headers = dict(headers or {})


def bad(message: str) -> HTTPError:
    return HTTPError(HTTPStatus.BAD_REQUEST, message)


def error_json(status: int, message: str) -> dict[str, Any]:
    """The body of every error response (SGLang's shape)."""
    return {"error": {"message": message, "code": int(status)}}


# -- JSON with limits -------------------------------------------------------------------


class _LimitError(Exception):
    """A JSON literal over a limit (not a ValueError: json would report it as malformed)."""


def _int_literal(text: str) -> int:
    if len(text) > MAX_INT_CHARS:
        raise _LimitError(
            f"integer literal of {len(text)} characters (at most {MAX_INT_CHARS} accepted)"
        )
    return int(text)


def _float_literal(text: str) -> float:
    if len(text) > MAX_FLOAT_CHARS:
        raise _LimitError(
            f"number literal of {len(text)} characters (at most {MAX_FLOAT_CHARS} accepted)"
        )
    value = float(text)
    if not math.isfinite(value):
        raise _LimitError(f"number {text} is out of range")
    return value


def _constant(text: str) -> Any:
    raise _LimitError(f"{text} is not JSON (no NaN or Infinity)")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _LimitError(f"duplicate key {key!r:.40} in an object")
        out[key] = value
    return out


def parse_json(raw: bytes) -> Any:
    """Decode a request body; an empty body is ``{}``. Bad or over-limit JSON is a 400."""
    try:
        text = raw.decode("utf-8")  # JSON between systems is UTF-8 (RFC 8259 section 8.1)
    except UnicodeDecodeError as e:
        raise bad(f"the body is not UTF-8: {e}") from None
    if not text.strip():
        return {}
    try:
        value = json.loads(
            text,
            parse_int=_int_literal,
            parse_float=_float_literal,
            parse_constant=_constant,
            object_pairs_hook=_object,
        )
    except _LimitError as e:
        raise bad(f"JSON refused: {e}") from None
    except RecursionError:
        raise bad(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # JSONDecodeError
        raise bad(f"malformed JSON: {e}") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:  # else too few to nest that deep
        _check_depth(value)
    return value


def _check_depth(value: Any) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise bad(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (list, dict)))


# -- field checks -----------------------------------------------------------------------


def _int(value: Any, name: str, *, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{name} must be an integer, got {type(value).__name__} {value!r:.40}")
    if not lo <= value <= hi:
        raise bad(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def _one_or_list(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != n:
            raise bad(f"{name} has {len(value)} entries for a batch of {n}")
        return value
    return [value] * n


def _object_body(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad(f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)}; supported: {', '.join(sorted(allowed))}")
    return body


# -- /generate --------------------------------------------------------------------------

_Prompt = tuple[list[int] | None, int | None]


def parse_generate(body: Any, engine: Engine) -> tuple[list[GenRequest], bool]:
    """Validate a ``/generate`` body; return the requests and whether it was a batch."""
    body = _object_body(body, GENERATE_KEYS)
    if body.get("text") is not None:
        raise bad("this engine has no tokenizer: send input_ids (or context_len), not text")
    if body.get("stream"):
        raise bad("streaming is not supported by the reference engine; send stream=false")
    if body.get("return_logprob"):
        raise bad("return_logprob is not supported by the reference engine")
    prompts, batch = _prompts(body, engine)
    n = len(prompts)
    if n > engine.cfg.max_batch_size:
        raise bad(
            f"batch of {n} requests exceeds the maximum batch size {engine.cfg.max_batch_size}"
        )
    sps = _one_or_list(body.get("sampling_params", {}), n, "sampling_params")
    rids = _one_or_list(body.get("rid"), n, "rid")
    seeds = _one_or_list(body.get("synthetic_seed", 0), n, "synthetic_seed")
    reqs = [
        _request(prompt, sp, rid, seed, engine)
        for prompt, sp, rid, seed in zip(prompts, sps, rids, seeds)
    ]
    if len({r.rid for r in reqs}) != len(reqs):
        raise bad("rid values in a batch must be distinct")
    return reqs, batch


def _prompts(body: dict[str, Any], engine: Engine) -> tuple[list[_Prompt], bool]:
    ids = body.get("input_ids")
    ctx = body.get("context_len")
    if (ids is None) == (ctx is None):
        raise bad("give exactly one of input_ids and context_len")
    if ids is not None:
        return _id_prompts(ids, engine.cfg.vocab_size)
    batch = isinstance(ctx, list)
    lens = ctx if batch else [ctx]
    if not lens:
        raise bad("context_len list is empty")
    hi = engine.cfg.max_context_len
    return [(None, _int(c, "context_len", lo=1, hi=hi)) for c in lens], batch


def _id_prompts(ids: Any, vocab: int) -> tuple[list[_Prompt], bool]:
    if not isinstance(ids, list) or not ids:
        raise bad("input_ids must be a non-empty list of token ids (or a list of such lists)")
    batch = isinstance(ids[0], list)
    rows = ids if batch else [ids]
    prompts: list[_Prompt] = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or not row:
            raise bad(f"input_ids[{i}] must be a non-empty list of token ids")
        for t in row:
            if isinstance(t, bool) or not isinstance(t, int):
                raise bad(f"input_ids must hold integers, got {type(t).__name__} {t!r:.40}")
            if not 0 <= t < vocab:
                raise bad(f"token id {t} is outside the vocabulary [0, {vocab})")
        prompts.append((row, None))
    return prompts, batch


def _request(prompt: _Prompt, sp: Any, rid: Any, seed: Any, engine: Engine) -> GenRequest:
    if not isinstance(sp, dict):
        raise bad("sampling_params must be an object")
    extra = sorted(set(sp) - SAMPLING_KEYS)
    if extra:
        raise bad(
            f"unsupported sampling_params {', '.join(extra)}; supported: "
            f"{', '.join(sorted(SAMPLING_KEYS))} (greedy decoding only)"
        )
    temp = sp.get("temperature", 0)
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or temp != 0:
        raise bad(f"temperature must be 0 (greedy decoding only), got {temp!r:.40}")
    mnt = _int(sp.get("max_new_tokens", 128), "max_new_tokens", lo=1, hi=MAX_NEW_TOKENS_LIMIT)
    ignore_eos = sp.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad(f"ignore_eos must be true or false, got {ignore_eos!r:.40}")
    steps = sp.get("max_decode_steps")
    if steps is not None:
        steps = _int(steps, "max_decode_steps", lo=1, hi=MAX_NEW_TOKENS_LIMIT)
    if rid is None:
        rid = uuid.uuid4().hex
    if not isinstance(rid, str) or not 0 < len(rid) <= MAX_RID_CHARS:
        raise bad(f"rid must be a non-empty string of at most {MAX_RID_CHARS} characters")
    req = GenRequest(
        rid=rid,
        max_new_tokens=mnt,
        input_ids=prompt[0],
        context_len=prompt[1],
        ignore_eos=ignore_eos,
        seed=_int(seed, "synthetic_seed", lo=0, hi=MAX_SEED),
        max_decode_steps=steps,
    )
    try:
        engine.validate(req)
    except RequestError as e:
        raise bad(str(e)) from None
    return req


def result_json(res: GenResult) -> dict[str, Any]:
    """One ``/generate`` result in SGLang's shape, plus our ``meta_info.specperf``."""
    return {
        "text": "",
        "output_ids": res.output_ids,
        "meta_info": {
            "id": res.rid,
            "prompt_tokens": res.prompt_tokens,
            "completion_tokens": res.completion_tokens,
            "spec_verify_ct": res.spec_verify_ct,
            "spec_accept_length": round(res.spec_accept_length, 4),
            "e2e_latency": round(res.e2e_latency, 6),
            "finish_reason": {"type": res.finish_reason},
            "specperf": {
                "kv_layout": res.kv_layout,
                "kv_fragmentation": round(res.kv_fragmentation, 6),
                "kv_pages": res.kv_pages,
                "synthetic_prefill": res.synthetic_prefill,
                "reference_ms": None if res.reference_ms is None else round(res.reference_ms, 4),
            },
        },
    }


# -- /specperf/kv_layout and /specperf/profile ------------------------------------------


@dataclass(frozen=True)
class KVLayoutRequest:
    layout: str
    level: float
    seed: int

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.layout, "level": self.level, "seed": self.seed}


def parse_kv_layout(body: Any) -> KVLayoutRequest:
    """Validate a ``/specperf/kv_layout`` body."""
    body = _object_body(body, KV_LAYOUT_KEYS)
    layout = body.get("layout")
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise bad(f"unknown KV layout {layout!r:.40}; choose one of: {', '.join(LAYOUTS)}")
    level = body.get("level", 1.0 if layout == "fragmented" else 0.0)
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 <= level <= 1:
        raise bad(f"level must be a number in [0, 1], got {level!r:.40}")
    seed = _int(body.get("seed", 0), "seed", lo=0, hi=MAX_SEED)
    return KVLayoutRequest(layout, float(level), seed)


def parse_profile(body: Any) -> str:
    """Validate a ``/specperf/profile`` body; return the action (start or stop)."""
    if not isinstance(body, dict) or set(body) - {"action"}:
        raise bad('the body must be {"action": "start"} or {"action": "stop"}')
    action = body.get("action")
    if action not in PROFILE_ACTIONS:
        raise bad(f"unknown profile action {action!r:.40}; use start or stop")
    return str(action)
