"""HTTP fuzz corpus: bad requests, sent raw, against a real reference server on 127.0.0.1.

Each request gets the specific 4xx/5xx JSON error it deserves (or, where HTTP says so, a
closed connection), and the server answers /health after every one. The corpus is
fixed (no random generation), so a failure names its case and repeats exactly.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from rawhttp import Exchange, address, exchange, launch_reference

from pytest_specperf.server import ServerClient

pytestmark = pytest.mark.faults

TIMEOUT_S = 1.0
MAX_BODY = 65536
MIN_CASES = 120
#: The whole corpus must finish within this (it takes a few seconds).
BUDGET_S = 60.0


@dataclass(frozen=True)
class Case:
    category: str
    name: str
    parts: tuple[bytes, ...]
    status: int | None  # None: the server closes the connection without an answer
    fragment: str = ""
    pause_s: float = 0.0
    half_close: bool = True
    slow: bool = False
    head_only: bool = False


def req(
    method: str = "GET",
    target: str = "/health",
    *,
    headers: tuple[str, ...] = (),
    body: bytes = b"",
    version: str = "HTTP/1.1",
    host: bool = True,
    length: bool | None = None,
) -> bytes:
    """One request; Content-Length is added when there is a body (unless ``length``)."""
    lines = [f"{method} {target} {version}"]
    if host:
        lines.append("Host: 127.0.0.1")
    lines += headers
    if length or (length is None and body):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def post(path: str, body: bytes | str) -> bytes:
    return req("POST", path, body=body.encode() if isinstance(body, str) else body)


def _methods() -> list[Case]:
    c = "method"
    return [
        Case(c, "lowercase", (req("get"),), 501, "method get is not implemented"),
        Case(c, "unknown FOO", (req("FOO"),), 501, "method FOO is not implemented"),
        Case(c, "unknown BREW", (req("BREW", "/generate"),), 501, "method BREW"),
        Case(c, "PROPFIND", (req("PROPFIND"),), 501, "method PROPFIND"),
        Case(c, "very long", (req("A" * 300),), 501, "method " + "A" * 20 + " is"),
        Case(c, "bad char @", (req("G@T"),), 400, "malformed method 'G@T'"),
        Case(c, "bad char (", (req("GE(T"),), 400, "malformed method"),
        Case(c, "empty", (b" /health HTTP/1.1\r\nHost: x\r\n\r\n",), 400, "malformed method ''"),
        Case(
            c,
            "tab separated",
            (b"GET\t/health HTTP/1.1\r\nHost: x\r\n\r\n",),
            400,
            "malformed request line",
        ),
        Case(
            c,
            "CONNECT authority",
            (req("CONNECT", "127.0.0.1:1"),),
            400,
            "must be a path starting with /",
        ),
        Case(c, "M-SEARCH *", (req("M-SEARCH", "*"),), 400, "must be a path starting with /"),
    ]


def _request_lines() -> list[Case]:
    c = "request-line"
    h = b"\r\nHost: x\r\n\r\n"
    return [
        Case(c, "HTTP/0.9", (b"GET /health\r\n\r\n",), 400, "malformed request line"),
        Case(c, "four words", (b"GET /health HTTP/1.1 extra" + h,), 400, "malformed request line"),
        Case(c, "double space", (b"GET  /health HTTP/1.1" + h,), 400, "malformed request line"),
        Case(c, "HTTP/2.0", (b"GET /health HTTP/2.0" + h,), 505, "HTTP/2.0 is not supported"),
        Case(c, "HTTP/3.0", (b"GET /health HTTP/3.0" + h,), 505, "HTTP/3.0 is not supported"),
        Case(c, "HTTP/0.9 version", (b"GET /health HTTP/0.9" + h,), 505, "not supported"),
        Case(c, "HTTP/1", (b"GET /health HTTP/1" + h,), 400, "bad HTTP version 'HTTP/1'"),
        Case(c, "HTTP/1.1.1", (b"GET /health HTTP/1.1.1" + h,), 400, "bad HTTP version"),
        Case(c, "HTTP/a.b", (b"GET /health HTTP/a.b" + h,), 400, "bad HTTP version"),
        Case(c, "FTP/1.1", (b"GET /health FTP/1.1" + h,), 400, "bad HTTP version"),
        Case(c, "lowercase http", (b"GET /health http/1.1" + h,), 400, "bad HTTP version"),
        Case(c, "HTTP/11.1", (b"GET /health HTTP/11.1" + h,), 400, "bad HTTP version"),
        Case(c, "target without /", (req("GET", "health"),), 400, "must be a path starting with /"),
        Case(c, "NUL in target", (req("GET", "/he\x00alth"),), 400, "control character"),
        Case(c, "DEL in target", (req("GET", "/he\x7falth"),), 400, "control character"),
        Case(c, "ESC in target", (req("GET", "/\x1b[31m"),), 400, "control character"),
        Case(
            c,
            "9000-byte line",
            (req("GET", "/" + "a" * 9000),),
            414,
            "request line longer than 8192",
        ),
        Case(c, "70000-byte line", (req("GET", "/" + "a" * 70000),), 414, "request line longer"),
        Case(c, "6 empty lines first", (b"\r\n" * 6 + req(),), 400, "no request line"),
        Case(c, "latin-1 path", (req("GET", "/h\xe9alth"),), 404, "no route GET /h"),
        Case(c, "unknown path", (req("GET", "/nope"),), 404, "no route GET /nope"),
        Case(c, "trailing slash", (req("GET", "/health/"),), 404, "no route GET /health/"),
        Case(c, "absolute form unknown", (req("GET", "http://x/nope"),), 404, "no route GET /nope"),
        Case(c, "dot segments", (req("GET", "/specperf/../health"),), 404, "no route"),
        Case(c, "percent-encoded", (req("GET", "/%68ealth"),), 404, "no route GET /%68ealth"),
    ]


def _headers() -> list[Case]:
    c = "header"

    def h(*lines: str, **kw: bool) -> tuple[bytes, ...]:
        return (req(headers=lines, **kw),)

    many = tuple(f"X-H{i}: {i}" for i in range(65))
    big = tuple(f"X-B{i}: {'b' * 7000}" for i in range(5))
    return [
        Case(c, "no colon", h("X-Foo bar"), 400, "has no colon"),
        Case(c, "space before colon", h("X-Foo : bar"), 400, "malformed header name 'X-Foo '"),
        Case(c, "obs-fold space", h("X-Foo: a", " continued"), 400, "folded header lines"),
        Case(c, "obs-fold tab", h("X-Foo: a", "\tcontinued"), 400, "folded header lines"),
        Case(c, "NUL in value", h("X-Foo: a\x00b"), 400, "header X-Foo holds a control character"),
        Case(c, "bare CR in value", h("X-Foo: a\rb"), 400, "holds a control character"),
        Case(c, "bare LF-like ESC", h("X-Foo: \x1b[2J"), 400, "holds a control character"),
        Case(c, "bad name char", h("X(Y): 1"), 400, "malformed header name 'X(Y)'"),
        Case(c, "empty name", h(": value"), 400, "malformed header name ''"),
        Case(c, "non-ASCII name", h("X-\xe9: 1"), 400, "malformed header name"),
        Case(
            c, "9000-byte line", h("X-Long: " + "l" * 9000), 431, "header section longer than 8192"
        ),
        Case(c, "65 headers", h(*many), 431, "more than 64 headers"),
        Case(c, "35 KB of headers", h(*big), 431, "headers larger than 32768 bytes"),
        Case(c, "HTTP/1.1 without Host", h(host=False), 400, "exactly one Host header, got 0"),
        Case(c, "two Host headers", h("Host: y"), 400, "exactly one Host header, got 2"),
        Case(
            c,
            "Expect: bogus",
            (req("POST", "/flush_cache", headers=("Expect: bogus",), body=b"{}"),),
            417,
            "unsupported expectation 'bogus'",
        ),
    ]


def _lengths() -> list[Case]:
    c = "content-length"

    def cl(*values: str, extra: tuple[str, ...] = (), body: bytes = b"{}") -> tuple[bytes, ...]:
        hs = tuple(f"Content-Length: {v}" for v in values) + extra
        return (req("POST", "/flush_cache", headers=hs, body=body, length=False),)

    msg = "is not a non-negative decimal number"
    return [
        Case(c, "letters", cl("abc"), 400, f"Content-Length 'abc' {msg}"),
        Case(c, "negative", cl("-1"), 400, msg),
        Case(c, "plus sign", cl("+2"), 400, msg),
        Case(c, "hex", cl("0x2"), 400, msg),
        Case(c, "inner space", cl("1 0"), 400, msg),
        Case(c, "empty", cl(""), 400, msg),
        Case(c, "list", cl("2, 2"), 400, msg),
        Case(c, "float", cl("2.0"), 400, msg),
        Case(c, "underscore", cl("1_0"), 400, msg),
        Case(c, "superscript two", cl("\xb2"), 400, msg),
        Case(c, "two different", cl("2", "3"), 400, "more than one Content-Length"),
        Case(c, "two equal", cl("2", "2"), 400, "more than one Content-Length"),
        Case(
            c,
            "with chunked",
            cl("2", extra=("Transfer-Encoding: chunked",)),
            400,
            "both Transfer-Encoding and Content-Length",
        ),
        Case(
            c,
            "chunked",
            (
                req(
                    "POST",
                    "/flush_cache",
                    headers=("Transfer-Encoding: chunked",),
                    body=b"2\r\n{}\r\n0\r\n\r\n",
                    length=False,
                ),
            ),
            411,
            "chunked bodies are not supported",
        ),
        Case(
            c,
            "gzip, chunked",
            (req("POST", "/flush_cache", headers=("Transfer-Encoding: gzip, chunked",)),),
            411,
            "chunked bodies",
        ),
        Case(
            c,
            "gzip",
            (req("POST", "/flush_cache", headers=("Transfer-Encoding: gzip",)),),
            501,
            "transfer coding 'gzip' is not supported",
        ),
        Case(
            c,
            "chunked, gzip",
            (req("POST", "/flush_cache", headers=("Transfer-Encoding: chunked, gzip",)),),
            501,
            "transfer coding 'gzip'",
        ),
        Case(
            c,
            "GET with chunked",
            (req("GET", "/health", headers=("Transfer-Encoding: chunked",)),),
            411,
            "chunked",
        ),
    ]


def _oversized() -> list[Case]:
    c = "oversized"
    limit = f"exceeds the limit of {MAX_BODY} bytes"
    big = b'{"input_ids": [' + b"1," * 40_000 + b"1]}"
    return [
        Case(c, "80 KB body", (post("/generate", big),), 413, f"body of {len(big)} bytes {limit}"),
        Case(c, "1 MiB body", (post("/generate", b" " * (1 << 20)),), 413, limit),
        Case(c, "GET with 100 KB body", (req(body=b"x" * 100_000),), 413, limit),
        Case(
            c,
            "limit + 1",
            (post("/flush_cache", b" " * (MAX_BODY + 1)),),
            413,
            f"body of {MAX_BODY + 1} bytes",
        ),
        Case(
            c,
            "23-digit length",
            (req("POST", "/generate", headers=("Content-Length: " + "9" * 23,)),),
            413,
            "a Content-Length of 1000000000000000000 or more bytes",
        ),
        Case(
            c,
            "declared 10 MB, sends 1 KB",
            (req("POST", "/generate", headers=("Content-Length: 10000000",)) + b"x" * 1024,),
            413,
            "body of 10000000 bytes",
        ),
        Case(
            c,
            "Expect 100-continue",
            (req("POST", "/generate", headers=("Content-Length: 999999", "Expect: 100-continue")),),
            413,
            limit,
            half_close=False,
        ),
    ]


def _truncated() -> list[Case]:
    c = "truncated"
    return [
        Case(c, "request line", (b"GET /heal",), 400, "connection ended inside the request line"),
        Case(
            c,
            "after request line",
            (b"GET /health HTTP/1.1\r\n",),
            400,
            "inside the header section",
        ),
        Case(
            c, "inside a header", (b"GET /health HTTP/1.1\r\nHo",), 400, "inside the header section"
        ),
        Case(
            c,
            "before blank line",
            (b"GET /health HTTP/1.1\r\nHost: x\r\n",),
            400,
            "inside the header section",
        ),
        Case(
            c,
            "body 10 of 100",
            (req("POST", "/generate", headers=("Content-Length: 100",)) + b"x" * 10,),
            400,
            "the body ended after 10 of 100 bytes",
        ),
        Case(
            c,
            "body 0 of 50",
            (req("POST", "/generate", headers=("Content-Length: 50",)),),
            400,
            "after 0 of 50 bytes",
        ),
        Case(c, "nothing at all", (b"",), None),
        Case(c, "one empty line", (b"\r\n",), None),
    ]


def _slow() -> list[Case]:
    c = "slowloris"
    drip_head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Drip: " + b"d" * 40
    drip_body = req("POST", "/flush_cache", headers=("Content-Length: 3000",))
    dl = "did not arrive within its deadline"
    return [
        Case(c, "stall in request line", (b"GET /hea",), 408, dl, half_close=False, slow=True),
        Case(
            c,
            "stall in headers",
            (b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: 1",),
            408,
            dl,
            half_close=False,
            slow=True,
        ),
        Case(c, "stall before body", (drip_body,), 408, dl, half_close=False, slow=True),
        Case(
            c,
            "drip headers",
            tuple(drip_head[i : i + 1] for i in range(len(drip_head))),
            408,
            dl,
            pause_s=0.05,
            half_close=False,
            slow=True,
        ),
        Case(
            c,
            "drip body",
            (drip_body, *(b"x" * 10 for _ in range(30))),
            408,
            dl,
            pause_s=0.1,
            half_close=False,
            slow=True,
        ),
    ]


def _bad_json() -> list[Case]:
    c = "bad-json"
    g = "/generate"
    bad = "malformed JSON"
    return [
        Case(c, "truncated", (post(g, '{"input_ids": [1, 2'),), 400, bad),
        Case(c, "trailing garbage", (post(g, '{"input_ids": [1]} x'),), 400, f"{bad}: Extra data"),
        Case(c, "single quotes", (post(g, "{'input_ids': [1]}"),), 400, bad),
        Case(c, "trailing comma", (post(g, '{"input_ids": [1],}'),), 400, bad),
        Case(c, "comment", (post(g, '/* c */ {"input_ids": [1]}'),), 400, bad),
        Case(c, "NUL after object", (post(g, b'{"input_ids": [1]}\x00'),), 400, bad),
        Case(
            c,
            "control char in string",
            (post(g, b'{"rid": "a\x01b", "input_ids": [1]}'),),
            400,
            f"{bad}: Invalid control character",
        ),
        Case(c, "NaN", (post(g, '{"context_len": NaN}'),), 400, "NaN is not JSON"),
        Case(c, "Infinity", (post(g, '{"context_len": Infinity}'),), 400, "Infinity is not JSON"),
        Case(
            c, "-Infinity", (post(g, '{"context_len": -Infinity}'),), 400, "-Infinity is not JSON"
        ),
        Case(
            c,
            "duplicate key",
            (post(g, '{"input_ids": [1], "input_ids": [2]}'),),
            400,
            "duplicate key 'input_ids'",
        ),
        Case(
            c,
            "invalid UTF-8",
            (post(g, b'{"rid": "\xff", "input_ids": [1]}'),),
            400,
            "the body is not UTF-8",
        ),
        Case(
            c,
            "UTF-16",
            (post(g, '{"input_ids": [1]}'.encode("utf-16")),),
            400,
            "the body is not UTF-8",
        ),
        Case(c, "UTF-8 BOM", (post(g, b'\xef\xbb\xbf{"input_ids": [1]}'),), 400, "BOM"),
        Case(c, "null", (post(g, "null"),), 400, "must be a JSON object, got NoneType"),
        Case(c, "number", (post(g, "5"),), 400, "must be a JSON object, got int"),
        Case(c, "string", (post(g, '"x"'),), 400, "must be a JSON object, got str"),
        Case(c, "array", (post(g, "[]"),), 400, "must be a JSON object, got list"),
        Case(
            c,
            "empty object",
            (post(g, "{}"),),
            400,
            "give exactly one of input_ids and context_len",
        ),
        Case(c, "whitespace only", (post(g, "   "),), 400, "give exactly one of"),
        Case(c, "no body at all", (req("POST", g),), 400, "give exactly one of"),
        Case(c, "kv_layout garbage", (post("/specperf/kv_layout", "nope"),), 400, bad),
        Case(c, "flush_cache garbage", (post("/flush_cache", "{"),), 400, bad),
        Case(c, "profile garbage", (post("/specperf/profile", "[1,"),), 400, bad),
    ]


def _deep_and_huge() -> list[Case]:
    c, d = "deep-json", "nested deeper than 32 levels"
    n = "huge-number"
    g = "/generate"
    return [
        Case(c, "arrays 33", (post(g, "[" * 33 + "]" * 33),), 400, d),
        Case(c, "arrays 5000", (post(g, "[" * 5000 + "]" * 5000),), 400, d),
        Case(c, "objects 40", (post(g, '{"a":' * 40 + "1" + "}" * 40),), 400, d),
        Case(c, "objects 3000", (post(g, '{"a":' * 3000 + "1" + "}" * 3000),), 400, d),
        Case(
            c,
            "in input_ids",
            (post(g, '{"input_ids": ' + "[" * 40 + "1" + "]" * 40 + "}"),),
            400,
            d,
        ),
        Case(c, "mixed 100", (post(g, '[{"a":' * 50 + "1" + "}]" * 50),), 400, d),
        Case(
            n,
            "5001 digits",
            (post(g, '{"context_len": ' + "7" * 5001 + "}"),),
            400,
            "integer literal of 5001 characters",
        ),
        Case(
            n,
            "21 digits",
            (post(g, '{"context_len": ' + "1" * 21 + "}"),),
            400,
            "integer literal of 21 characters",
        ),
        Case(
            n,
            "negative 25 digits",
            (post(g, '{"input_ids": [-' + "3" * 24 + "]}"),),
            400,
            "integer literal of 25 characters",
        ),
        Case(n, "1e999", (post(g, '{"context_len": 1e999}'),), 400, "number 1e999 is out of range"),
        Case(
            n, "-1e999", (post(g, '{"context_len": -1e999}'),), 400, "number -1e999 is out of range"
        ),
        Case(
            n,
            "60-char float",
            (post(g, '{"context_len": 1.' + "0" * 58 + "}"),),
            400,
            "number literal of 60 characters",
        ),
        Case(
            n,
            "seed 2**63",
            (post(g, '{"input_ids": [1], "synthetic_seed": 9223372036854775808}'),),
            400,
            "synthetic_seed must be in",
        ),
        Case(
            n,
            "context 10**12",
            (post(g, '{"context_len": 1000000000000}'),),
            400,
            "context_len must be in",
        ),
        Case(
            n,
            "max_new_tokens 10**15",
            (
                post(
                    g, '{"input_ids": [1], "sampling_params": {"max_new_tokens": 1000000000000000}}'
                ),
            ),
            400,
            "max_new_tokens must be in",
        ),
    ]


def _types() -> list[Case]:
    c = "wrong-type"
    g = "/generate"

    def gen(body: str, fragment: str, name: str) -> Case:
        return Case(c, f"generate {name}", (post(g, body),), 400, fragment)

    def kv(body: str, fragment: str, name: str) -> Case:
        return Case(c, f"kv_layout {name}", (post("/specperf/kv_layout", body),), 400, fragment)

    return [
        gen('{"input_ids": "hello"}', "input_ids must be a non-empty list", "ids string"),
        gen('{"input_ids": {}}', "input_ids must be a non-empty list", "ids object"),
        gen('{"input_ids": [1.5]}', "input_ids must hold integers, got float", "ids float"),
        gen('{"input_ids": [true]}', "input_ids must hold integers, got bool", "ids bool"),
        gen('{"input_ids": [null]}', "input_ids must hold integers, got NoneType", "ids null"),
        gen('{"input_ids": [[1], [2.0]]}', "input_ids must hold integers", "batch float"),
        gen('{"input_ids": [[]]}', "input_ids[0] must be a non-empty list", "empty row"),
        gen('{"input_ids": [[1], 2]}', "input_ids[1] must be a non-empty list", "mixed rows"),
        gen('{"input_ids": [-1]}', "outside the vocabulary", "negative id"),
        gen('{"input_ids": [999999]}', "outside the vocabulary", "id too big"),
        gen('{"context_len": "46000"}', "context_len must be an integer, got str", "ctx string"),
        gen('{"context_len": true}', "context_len must be an integer, got bool", "ctx bool"),
        gen('{"context_len": 1e3}', "context_len must be an integer, got float", "ctx float"),
        gen('{"context_len": []}', "context_len list is empty", "ctx empty list"),
        gen('{"context_len": 0}', "context_len must be in [1,", "ctx zero"),
        gen('{"input_ids": null, "context_len": null}', "give exactly one", "both null"),
        gen(
            '{"input_ids": [1], "sampling_params": "x"}',
            "sampling_params must be an object",
            "sp string",
        ),
        gen(
            '{"input_ids": [1], "sampling_params": {"max_new_tokens": "5"}}',
            "max_new_tokens must be an integer",
            "mnt string",
        ),
        gen(
            '{"input_ids": [1], "sampling_params": {"ignore_eos": 1}}',
            "ignore_eos must be true or false",
            "eos int",
        ),
        gen(
            '{"input_ids": [1], "sampling_params": {"temperature": "0"}}',
            "temperature must be 0",
            "temp string",
        ),
        gen(
            '{"input_ids": [1], "sampling_params": {"temperature": 0.7}}',
            "greedy decoding only",
            "temp 0.7",
        ),
        gen('{"input_ids": [1], "rid": 5}', "rid must be a non-empty string", "rid int"),
        gen('{"input_ids": [1], "rid": ""}', "rid must be a non-empty string", "rid empty"),
        gen('{"input_ids": [1], "rid": "' + "r" * 201 + '"}', "at most 200 characters", "rid long"),
        gen(
            '{"input_ids": [[1], [2]], "rid": ["a", "a"]}',
            "rid values in a batch must be distinct",
            "rid dup",
        ),
        gen(
            '{"input_ids": [[1], [2]], "rid": ["a"]}',
            "rid has 1 entries for a batch of 2",
            "rid count",
        ),
        gen(
            '{"input_ids": [1], "synthetic_seed": -1}', "synthetic_seed must be in", "seed negative"
        ),
        gen(
            '{"input_ids": [1], "synthetic_seed": "1"}',
            "synthetic_seed must be an integer",
            "seed string",
        ),
        gen('{"input_ids": [1], "stream": true}', "streaming is not supported", "stream"),
        gen(
            '{"input_ids": [1], "return_logprob": true}',
            "return_logprob is not supported",
            "logprob",
        ),
        gen('{"text": "hello"}', "no tokenizer", "text"),
        gen(
            '{"context_len": [1,1,1,1,1,1,1,1,1]}',
            "exceeds the maximum batch size",
            "batch too big",
        ),
        kv('{"layout": 5}', "unknown KV layout 5", "layout int"),
        kv('{"layout": ["contiguous"]}', "unknown KV layout", "layout list"),
        kv('{"layout": "swiss-cheese"}', "unknown KV layout 'swiss-cheese'", "layout unknown"),
        kv(
            '{"layout": "fragmented", "level": "high"}',
            "level must be a number in [0, 1]",
            "level string",
        ),
        kv(
            '{"layout": "fragmented", "level": 1.5}',
            "level must be a number in [0, 1]",
            "level 1.5",
        ),
        kv('{"layout": "fragmented", "level": true}', "level must be a number", "level bool"),
        kv('{"layout": "fragmented", "seed": -4}', "seed must be in", "seed negative"),
        kv('{"layout": "fragmented", "seed": 1.5}', "seed must be an integer", "seed float"),
        kv("[]", "must be a JSON object, got list", "array"),
        Case(
            c,
            "profile action pause",
            (post("/specperf/profile", '{"action": "pause"}'),),
            400,
            "unknown profile action 'pause'",
        ),
        Case(
            c,
            "profile action int",
            (post("/specperf/profile", '{"action": 5}'),),
            400,
            "unknown profile action 5",
        ),
        Case(
            c,
            "profile stop idle",
            (post("/specperf/profile", '{"action": "stop"}'),),
            409,
            "the profiler is not running",
        ),
    ]


def _unknown_fields() -> list[Case]:
    c = "unknown-field"
    return [
        Case(
            c,
            "generate bogus",
            (post("/generate", '{"input_ids": [1], "bogus": 1}'),),
            400,
            "unknown field(s) bogus",
        ),
        Case(
            c,
            "generate many",
            (post("/generate", '{"input_ids": [1], "b": 1, "a": 2}'),),
            400,
            "unknown field(s) a, b",
        ),
        Case(
            c,
            "sampling top_p",
            (post("/generate", '{"input_ids": [1], "sampling_params": {"top_p": 0.9}}'),),
            400,
            "unsupported sampling_params top_p",
        ),
        Case(
            c,
            "sampling stop",
            (post("/generate", '{"input_ids": [1], "sampling_params": {"stop": ["x"]}}'),),
            400,
            "unsupported sampling_params stop",
        ),
        Case(
            c,
            "kv_layout extra",
            (post("/specperf/kv_layout", '{"layout": "contiguous", "extra": 1}'),),
            400,
            "unknown field(s) extra",
        ),
        Case(
            c,
            "profile extra",
            (post("/specperf/profile", '{"action": "start", "x": 1}'),),
            400,
            "the body must be",
        ),
    ]


def _routes() -> list[Case]:
    c = "route"
    return [
        Case(
            c,
            "PUT /generate",
            (req("PUT", "/generate", body=b"{}"),),
            405,
            "/generate accepts POST, not PUT",
        ),
        Case(c, "DELETE /generate", (req("DELETE", "/generate"),), 405, "accepts POST, not DELETE"),
        Case(
            c,
            "PATCH kv_layout",
            (req("PATCH", "/specperf/kv_layout", body=b"{}"),),
            405,
            "accepts POST, not PATCH",
        ),
        Case(
            c, "OPTIONS /generate", (req("OPTIONS", "/generate"),), 405, "accepts POST, not OPTIONS"
        ),
        Case(
            c, "TRACE /server_info", (req("TRACE", "/server_info"),), 405, "accepts GET, not TRACE"
        ),
        Case(c, "HEAD /health", (req("HEAD", "/health"),), 405, head_only=True),
        Case(c, "HEAD unknown", (req("HEAD", "/nope"),), 404, head_only=True),
        Case(
            c, "GET /generate", (req("GET", "/generate"),), 405, "/generate accepts POST, not GET"
        ),
        Case(c, "GET with query", (req("GET", "/generate?x=1"),), 405, "/generate accepts POST"),
        Case(c, "POST /health", (post("/health", "{}"),), 405, "/health accepts GET, not POST"),
        Case(c, "PUT unknown", (req("PUT", "/nope"),), 404, "no route PUT /nope"),
        Case(
            c,
            "POST unknown",
            (post("/specperf/unknown", "{}"),),
            404,
            "no route POST /specperf/unknown",
        ),
    ]


def _pipelined() -> list[Case]:
    c = "pipelined"
    good = req()
    return [
        Case(
            c,
            "bad length then good",
            (req("POST", "/flush_cache", headers=("Content-Length: x",)) + good,),
            400,
            "Content-Length 'x'",
        ),
        Case(
            c,
            "TE+CL smuggle",
            (
                req(
                    "POST",
                    "/flush_cache",
                    headers=("Content-Length: 5", "Transfer-Encoding: chunked"),
                    length=False,
                )
                + b"0\r\n\r\n"
                + req("GET", "/nope"),
            ),
            400,
            "both Transfer-Encoding and Content-Length",
        ),
        Case(
            c,
            "413 then good",
            (post("/flush_cache", b" " * 70_000) + good,),
            413,
            "exceeds the limit",
        ),
        Case(
            c,
            "bad version then good",
            (b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n" + good,),
            505,
            "not supported",
        ),
    ]


def corpus() -> list[Case]:
    return [
        *_methods(),
        *_request_lines(),
        *_headers(),
        *_lengths(),
        *_oversized(),
        *_truncated(),
        *_slow(),
        *_bad_json(),
        *_deep_and_huge(),
        *_types(),
        *_unknown_fields(),
        *_routes(),
        *_pipelined(),
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerClient]:
    work = tmp_path_factory.mktemp("fuzz")
    proc, client = launch_reference(
        work, "--max-body-bytes", str(MAX_BODY), "--http-timeout", str(TIMEOUT_S)
    )
    yield client
    assert proc.proc is not None and proc.proc.poll() is None, "the server died in the corpus"
    proc.stop()


def _check(case: Case, ex: Exchange) -> str | None:
    """What is wrong with the server's answer to ``case`` (None: as expected)."""
    if case.status is None:
        if ex.responses or not ex.closed:
            return f"expected a closed connection, got {[r.status for r in ex.responses]}"
        return None
    if len(ex.responses) != 1:
        return f"expected one response, got {[r.status for r in ex.responses]}"
    resp = ex.responses[0]
    if resp.status != case.status:
        return f"expected HTTP {case.status}, got {resp.status}: {resp.body[:200]!r}"
    if resp.headers.get("content-type") != "application/json":
        return f"content type {resp.headers.get('content-type')!r}"
    if resp.status == 405 and not resp.headers.get("allow"):
        return "405 without Allow"
    if case.head_only:
        return None
    err = json.loads(resp.body)["error"]
    if err["code"] != case.status or case.fragment not in err["message"]:
        return f"error {err!r} lacks {case.fragment!r}"
    return None


def _run(client: ServerClient, case: Case) -> tuple[Case, str | None]:
    ex = exchange(
        address(client),
        list(case.parts),
        pause_s=case.pause_s,
        half_close=case.half_close,
        wait_s=TIMEOUT_S + 5 if case.slow else 5,
        head_only=case.head_only,
    )
    problem = _check(case, ex)
    try:
        alive = client.get("/health", timeout=10) == {"status": "ok"}
    except Exception as e:  # reported with the case that caused it
        alive, problem = False, f"{problem or ''} /health failed after it: {e}"
    if not alive and problem is None:
        problem = "/health did not answer ok after it"
    return case, problem


def test_http_fuzz_corpus(server: ServerClient, capsys: pytest.CaptureFixture[str]) -> None:
    cases = corpus()
    assert len({c.parts for c in cases}) == len(cases), "duplicate requests in the corpus"
    assert len({(c.category, c.name) for c in cases}) == len(cases)
    assert len(cases) >= MIN_CASES
    t0 = time.monotonic()
    slow = [c for c in cases if c.slow]
    with ThreadPoolExecutor(max_workers=len(slow)) as pool:
        pending = [pool.submit(_run, server, c) for c in slow]
        results = [_run(server, c) for c in cases if not c.slow]  # meanwhile, the rest
        results += [f.result() for f in pending]
    elapsed = time.monotonic() - t0
    failures = [f"{c.category}/{c.name}: {p}" for c, p in results if p]
    outcomes = Counter("closed" if c.status is None else str(c.status) for c, _ in results)
    categories = Counter(c.category for c, _ in results)
    with capsys.disabled():
        print(
            f"\nHTTP fuzz corpus: {len(results)} requests in {len(categories)} categories, "
            f"{elapsed:.1f} s; outcomes {dict(sorted(outcomes.items()))}; "
            f"{len(results) - len(failures)} as expected, {len(failures)} not"
        )
    assert not failures, "\n".join(failures)
    assert elapsed < BUDGET_S
    info = server.server_info()
    assert info["http_counters"]["timeouts"] >= len(slow)
