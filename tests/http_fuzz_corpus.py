"""The HTTP fuzz corpus of the reference server: one bad request per line, with the answer
it deserves. Used by test_reference_http_fuzz.py; kept one case per line, as a table."""

from __future__ import annotations

from dataclasses import dataclass

#: Limits the fuzzed server is started with (the expected messages name them).
TIMEOUT_S = 1.0
MAX_BODY = 65536


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


def req(method: str = "GET", target: str = "/health", *, headers: tuple[str, ...] = (),
        body: bytes = b"", version: str = "HTTP/1.1", host: bool = True,
        length: bool | None = None) -> bytes:
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


def one(category: str, name: str, request: bytes, status: int | None, fragment: str = "",
        **kw: object) -> Case:
    return Case(category, name, (request,), status, fragment, **kw)  # type: ignore[arg-type]


def methods() -> list[Case]:
    c = "method"
    return [
        one(c, "lowercase", req("get"), 501, "method get is not implemented"),
        one(c, "unknown FOO", req("FOO"), 501, "method FOO is not implemented"),
        one(c, "unknown BREW", req("BREW", "/generate"), 501, "method BREW"),
        one(c, "PROPFIND", req("PROPFIND"), 501, "method PROPFIND"),
        one(c, "very long", req("A" * 300), 501, "method " + "A" * 20 + " is"),
        one(c, "bad char @", req("G@T"), 400, "malformed method 'G@T'"),
        one(c, "bad char (", req("GE(T"), 400, "malformed method"),
        one(c, "empty", b" /health HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed method ''"),
        one(c, "tab separated", b"GET\t/health HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request line"),
        one(c, "CONNECT authority", req("CONNECT", "127.0.0.1:1"), 400, "must be a path starting with /"),
        one(c, "M-SEARCH *", req("M-SEARCH", "*"), 400, "must be a path starting with /"),
    ]


def request_lines() -> list[Case]:
    c, h = "request-line", b"\r\nHost: x\r\n\r\n"
    return [
        one(c, "HTTP/0.9", b"GET /health\r\n\r\n", 400, "malformed request line"),
        one(c, "four words", b"GET /health HTTP/1.1 extra" + h, 400, "malformed request line"),
        one(c, "double space", b"GET  /health HTTP/1.1" + h, 400, "malformed request line"),
        one(c, "HTTP/2.0", b"GET /health HTTP/2.0" + h, 505, "HTTP/2.0 is not supported"),
        one(c, "HTTP/3.0", b"GET /health HTTP/3.0" + h, 505, "HTTP/3.0 is not supported"),
        one(c, "HTTP/0.9 version", b"GET /health HTTP/0.9" + h, 505, "not supported"),
        one(c, "HTTP/1", b"GET /health HTTP/1" + h, 400, "bad HTTP version 'HTTP/1'"),
        one(c, "HTTP/1.1.1", b"GET /health HTTP/1.1.1" + h, 400, "bad HTTP version"),
        one(c, "HTTP/a.b", b"GET /health HTTP/a.b" + h, 400, "bad HTTP version"),
        one(c, "FTP/1.1", b"GET /health FTP/1.1" + h, 400, "bad HTTP version"),
        one(c, "lowercase http", b"GET /health http/1.1" + h, 400, "bad HTTP version"),
        one(c, "HTTP/11.1", b"GET /health HTTP/11.1" + h, 400, "bad HTTP version"),
        one(c, "target without /", req("GET", "health"), 400, "must be a path starting with /"),
        one(c, "NUL in target", req("GET", "/he\x00alth"), 400, "control character"),
        one(c, "DEL in target", req("GET", "/he\x7falth"), 400, "control character"),
        one(c, "ESC in target", req("GET", "/\x1b[31m"), 400, "control character"),
        one(c, "9000-byte line", req("GET", "/" + "a" * 9000), 414, "request line longer than 8192"),
        one(c, "70000-byte line", req("GET", "/" + "a" * 70000), 414, "request line longer"),
        one(c, "6 empty lines first", b"\r\n" * 6 + req(), 400, "no request line"),
        one(c, "latin-1 path", req("GET", "/h\xe9alth"), 404, "no route GET /h"),
        one(c, "unknown path", req("GET", "/nope"), 404, "no route GET /nope"),
        one(c, "trailing slash", req("GET", "/health/"), 404, "no route GET /health/"),
        one(c, "absolute form unknown", req("GET", "http://x/nope"), 404, "no route GET /nope"),
        one(c, "dot segments", req("GET", "/specperf/../health"), 404, "no route"),
        one(c, "percent-encoded", req("GET", "/%68ealth"), 404, "no route GET /%68ealth"),
    ]


def headers() -> list[Case]:
    c = "header"
    many = tuple(f"X-H{i}: {i}" for i in range(65))
    big = tuple(f"X-B{i}: {'b' * 7000}" for i in range(5))
    expect = req("POST", "/flush_cache", headers=("Expect: bogus",), body=b"{}")
    return [
        one(c, "no colon", req(headers=("X-Foo bar",)), 400, "has no colon"),
        one(c, "space before colon", req(headers=("X-Foo : bar",)), 400, "malformed header name 'X-Foo '"),
        one(c, "obs-fold space", req(headers=("X-Foo: a", " continued")), 400, "folded header lines"),
        one(c, "obs-fold tab", req(headers=("X-Foo: a", "\tcontinued")), 400, "folded header lines"),
        one(c, "NUL in value", req(headers=("X-Foo: a\x00b",)), 400, "header X-Foo holds a control character"),
        one(c, "bare CR in value", req(headers=("X-Foo: a\rb",)), 400, "holds a control character"),
        one(c, "ESC in value", req(headers=("X-Foo: \x1b[2J",)), 400, "holds a control character"),
        one(c, "bad name char", req(headers=("X(Y): 1",)), 400, "malformed header name 'X(Y)'"),
        one(c, "empty name", req(headers=(": value",)), 400, "malformed header name ''"),
        one(c, "non-ASCII name", req(headers=("X-\xe9: 1",)), 400, "malformed header name"),
        one(c, "9000-byte line", req(headers=("X-Long: " + "l" * 9000,)), 431, "header section longer than 8192"),
        one(c, "65 headers", req(headers=many), 431, "more than 64 headers"),
        one(c, "35 KB of headers", req(headers=big), 431, "headers larger than 32768 bytes"),
        one(c, "HTTP/1.1 without Host", req(host=False), 400, "exactly one Host header, got 0"),
        one(c, "two Host headers", req(headers=("Host: y",)), 400, "exactly one Host header, got 2"),
        one(c, "Expect: bogus", expect, 417, "unsupported expectation 'bogus'"),
    ]


def _cl(*values: str, extra: tuple[str, ...] = ()) -> bytes:
    hs = tuple(f"Content-Length: {v}" for v in values) + extra
    return req("POST", "/flush_cache", headers=hs, body=b"{}", length=False)


def _te(coding: str, method: str = "POST", path: str = "/flush_cache") -> bytes:
    return req(method, path, headers=(f"Transfer-Encoding: {coding}",))


def lengths() -> list[Case]:
    c, msg = "content-length", "is not a non-negative decimal number"
    chunked = req("POST", "/flush_cache", headers=("Transfer-Encoding: chunked",),
                  body=b"2\r\n{}\r\n0\r\n\r\n", length=False)
    return [
        one(c, "letters", _cl("abc"), 400, f"Content-Length 'abc' {msg}"),
        one(c, "negative", _cl("-1"), 400, msg),
        one(c, "plus sign", _cl("+2"), 400, msg),
        one(c, "hex", _cl("0x2"), 400, msg),
        one(c, "inner space", _cl("1 0"), 400, msg),
        one(c, "empty", _cl(""), 400, msg),
        one(c, "list", _cl("2, 2"), 400, msg),
        one(c, "float", _cl("2.0"), 400, msg),
        one(c, "underscore", _cl("1_0"), 400, msg),
        one(c, "superscript two", _cl("\xb2"), 400, msg),
        one(c, "two different", _cl("2", "3"), 400, "more than one Content-Length"),
        one(c, "two equal", _cl("2", "2"), 400, "more than one Content-Length"),
        one(c, "with chunked", _cl("2", extra=("Transfer-Encoding: chunked",)), 400, "both Transfer-Encoding and Content-Length"),
        one(c, "chunked", chunked, 411, "chunked bodies are not supported"),
        one(c, "gzip, chunked", _te("gzip, chunked"), 411, "chunked bodies"),
        one(c, "gzip", _te("gzip"), 501, "transfer coding 'gzip' is not supported"),
        one(c, "chunked, gzip", _te("chunked, gzip"), 501, "transfer coding 'gzip'"),
        one(c, "GET with chunked", _te("chunked", "GET", "/health"), 411, "chunked"),
    ]


def oversized() -> list[Case]:
    c, limit = "oversized", f"exceeds the limit of {MAX_BODY} bytes"
    big = b'{"input_ids": [' + b"1," * 40_000 + b"1]}"
    huge = req("POST", "/generate", headers=("Content-Length: " + "9" * 23,))
    declared = req("POST", "/generate", headers=("Content-Length: 10000000",)) + b"x" * 1024
    waiting = req("POST", "/generate", headers=("Content-Length: 999999", "Expect: 100-continue"))
    return [
        one(c, "80 KB body", post("/generate", big), 413, f"body of {len(big)} bytes {limit}"),
        one(c, "1 MiB body", post("/generate", b" " * (1 << 20)), 413, limit),
        one(c, "GET with 100 KB body", req(body=b"x" * 100_000), 413, limit),
        one(c, "limit + 1", post("/flush_cache", b" " * (MAX_BODY + 1)), 413, f"body of {MAX_BODY + 1} bytes"),
        one(c, "23-digit length", huge, 413, "a Content-Length of 1000000000000000000 or more bytes"),
        one(c, "declared 10 MB, sends 1 KB", declared, 413, "body of 10000000 bytes"),
        one(c, "Expect 100-continue", waiting, 413, limit, half_close=False),
    ]


def truncated() -> list[Case]:
    c = "truncated"
    short = req("POST", "/generate", headers=("Content-Length: 100",)) + b"x" * 10
    return [
        one(c, "request line", b"GET /heal", 400, "connection ended inside the request line"),
        one(c, "after request line", b"GET /health HTTP/1.1\r\n", 400, "inside the header section"),
        one(c, "inside a header", b"GET /health HTTP/1.1\r\nHo", 400, "inside the header section"),
        one(c, "before blank line", b"GET /health HTTP/1.1\r\nHost: x\r\n", 400, "inside the header section"),
        one(c, "body 10 of 100", short, 400, "the body ended after 10 of 100 bytes"),
        one(c, "body 0 of 50", req("POST", "/generate", headers=("Content-Length: 50",)), 400, "after 0 of 50 bytes"),
        one(c, "nothing at all", b"", None),
        one(c, "one empty line", b"\r\n", None),
    ]


def slow() -> list[Case]:
    c, dl = "slowloris", "did not arrive within its deadline"
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Drip: " + b"d" * 40
    body_next = req("POST", "/flush_cache", headers=("Content-Length: 3000",))
    drip_head = tuple(head[i : i + 1] for i in range(len(head)))
    drip_body = (body_next, *(b"x" * 10 for _ in range(30)))
    kw = {"half_close": False, "slow": True}
    return [
        one(c, "stall in request line", b"GET /hea", 408, dl, **kw),
        one(c, "stall in headers", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: 1", 408, dl, **kw),
        one(c, "stall before body", body_next, 408, dl, **kw),
        Case(c, "drip headers", drip_head, 408, dl, pause_s=0.05, half_close=False, slow=True),
        Case(c, "drip body", drip_body, 408, dl, pause_s=0.1, half_close=False, slow=True),
    ]


def malformed_json() -> list[Case]:
    c, g, bad = "bad-json", "/generate", "malformed JSON"
    return [
        one(c, "truncated", post(g, '{"input_ids": [1, 2'), 400, bad),
        one(c, "trailing garbage", post(g, '{"input_ids": [1]} x'), 400, f"{bad}: Extra data"),
        one(c, "single quotes", post(g, "{'input_ids': [1]}"), 400, bad),
        one(c, "trailing comma", post(g, '{"input_ids": [1],}'), 400, bad),
        one(c, "comment", post(g, '/* c */ {"input_ids": [1]}'), 400, bad),
        one(c, "NUL after object", post(g, b'{"input_ids": [1]}\x00'), 400, bad),
        one(c, "control char in string", post(g, b'{"rid": "a\x01b", "input_ids": [1]}'), 400, f"{bad}: Invalid control character"),
        one(c, "NaN", post(g, '{"context_len": NaN}'), 400, "NaN is not JSON"),
        one(c, "Infinity", post(g, '{"context_len": Infinity}'), 400, "Infinity is not JSON"),
        one(c, "-Infinity", post(g, '{"context_len": -Infinity}'), 400, "-Infinity is not JSON"),
        one(c, "duplicate key", post(g, '{"input_ids": [1], "input_ids": [2]}'), 400, "duplicate key 'input_ids'"),
        one(c, "invalid UTF-8", post(g, b'{"rid": "\xff", "input_ids": [1]}'), 400, "the body is not UTF-8"),
        one(c, "UTF-16", post(g, '{"input_ids": [1]}'.encode("utf-16")), 400, "the body is not UTF-8"),
        one(c, "UTF-8 BOM", post(g, b'\xef\xbb\xbf{"input_ids": [1]}'), 400, "BOM"),
        one(c, "kv_layout garbage", post("/specperf/kv_layout", "nope"), 400, bad),
        one(c, "flush_cache garbage", post("/flush_cache", "{"), 400, bad),
        one(c, "profile garbage", post("/specperf/profile", "[1,"), 400, bad),
    ]


def not_an_object() -> list[Case]:
    c, g = "not-an-object", "/generate"
    return [
        one(c, "null", post(g, "null"), 400, "must be a JSON object, got NoneType"),
        one(c, "number", post(g, "5"), 400, "must be a JSON object, got int"),
        one(c, "string", post(g, '"x"'), 400, "must be a JSON object, got str"),
        one(c, "array", post(g, "[]"), 400, "must be a JSON object, got list"),
        one(c, "empty object", post(g, "{}"), 400, "give exactly one of input_ids and context_len"),
        one(c, "whitespace only", post(g, "   "), 400, "give exactly one of"),
        one(c, "no body at all", req("POST", g), 400, "give exactly one of"),
    ]


def deep_json() -> list[Case]:
    c, g, d = "deep-json", "/generate", "nested deeper than 32 levels"
    return [
        one(c, "arrays 33", post(g, "[" * 33 + "]" * 33), 400, d),
        one(c, "arrays 5000", post(g, "[" * 5000 + "]" * 5000), 400, d),
        one(c, "objects 40", post(g, '{"a":' * 40 + "1" + "}" * 40), 400, d),
        one(c, "objects 3000", post(g, '{"a":' * 3000 + "1" + "}" * 3000), 400, d),
        one(c, "in input_ids", post(g, '{"input_ids": ' + "[" * 40 + "1" + "]" * 40 + "}"), 400, d),
        one(c, "mixed 100", post(g, '[{"a":' * 50 + "1" + "}]" * 50), 400, d),
    ]


def huge_numbers() -> list[Case]:
    c, g = "huge-number", "/generate"
    return [
        one(c, "5001 digits", post(g, '{"context_len": ' + "7" * 5001 + "}"), 400, "integer literal of 5001 characters"),
        one(c, "21 digits", post(g, '{"context_len": ' + "1" * 21 + "}"), 400, "integer literal of 21 characters"),
        one(c, "negative 25 digits", post(g, '{"input_ids": [-' + "3" * 24 + "]}"), 400, "integer literal of 25 characters"),
        one(c, "1e999", post(g, '{"context_len": 1e999}'), 400, "number 1e999 is out of range"),
        one(c, "-1e999", post(g, '{"context_len": -1e999}'), 400, "number -1e999 is out of range"),
        one(c, "60-char float", post(g, '{"context_len": 1.' + "0" * 58 + "}"), 400, "number literal of 60 characters"),
        one(c, "seed 2**63", post(g, '{"input_ids": [1], "synthetic_seed": 9223372036854775808}'), 400, "synthetic_seed must be in"),
        one(c, "context 10**12", post(g, '{"context_len": 1000000000000}'), 400, "context_len must be in"),
        one(c, "max_new_tokens 10**15", post(g, '{"input_ids": [1], "sampling_params": {"max_new_tokens": 1000000000000000}}'), 400, "max_new_tokens must be in"),
    ]


def _gen(name: str, body: str, fragment: str) -> Case:
    return one("wrong-type", f"generate {name}", post("/generate", body), 400, fragment)


def generate_types() -> list[Case]:
    return [
        _gen("ids string", '{"input_ids": "hello"}', "input_ids must be a non-empty list"),
        _gen("ids object", '{"input_ids": {}}', "input_ids must be a non-empty list"),
        _gen("ids float", '{"input_ids": [1.5]}', "input_ids must hold integers, got float"),
        _gen("ids bool", '{"input_ids": [true]}', "input_ids must hold integers, got bool"),
        _gen("ids null", '{"input_ids": [null]}', "input_ids must hold integers, got NoneType"),
        _gen("batch float", '{"input_ids": [[1], [2.0]]}', "input_ids must hold integers"),
        _gen("empty row", '{"input_ids": [[]]}', "input_ids[0] must be a non-empty list"),
        _gen("mixed rows", '{"input_ids": [[1], 2]}', "input_ids[1] must be a non-empty list"),
        _gen("negative id", '{"input_ids": [-1]}', "outside the vocabulary"),
        _gen("id too big", '{"input_ids": [999999]}', "outside the vocabulary"),
        _gen("ctx string", '{"context_len": "46000"}', "context_len must be an integer, got str"),
        _gen("ctx bool", '{"context_len": true}', "context_len must be an integer, got bool"),
        _gen("ctx float", '{"context_len": 1e3}', "context_len must be an integer, got float"),
        _gen("ctx empty list", '{"context_len": []}', "context_len list is empty"),
        _gen("ctx zero", '{"context_len": 0}', "context_len must be in [1,"),
        _gen("both null", '{"input_ids": null, "context_len": null}', "give exactly one"),
        _gen("sp string", '{"input_ids": [1], "sampling_params": "x"}', "sampling_params must be an object"),
        _gen("mnt string", '{"input_ids": [1], "sampling_params": {"max_new_tokens": "5"}}', "max_new_tokens must be an integer"),
        _gen("eos int", '{"input_ids": [1], "sampling_params": {"ignore_eos": 1}}', "ignore_eos must be true or false"),
        _gen("temp string", '{"input_ids": [1], "sampling_params": {"temperature": "0"}}', "temperature must be 0"),
        _gen("temp 0.7", '{"input_ids": [1], "sampling_params": {"temperature": 0.7}}', "greedy decoding only"),
        _gen("steps zero", '{"input_ids": [1], "sampling_params": {"max_decode_steps": 0}}', "max_decode_steps must be in [1,"),
        _gen("steps bool", '{"input_ids": [1], "sampling_params": {"max_decode_steps": true}}', "max_decode_steps must be an integer, got bool"),
        _gen("steps string", '{"input_ids": [1], "sampling_params": {"max_decode_steps": "4"}}', "max_decode_steps must be an integer, got str"),
        _gen("rid int", '{"input_ids": [1], "rid": 5}', "rid must be a non-empty string"),
        _gen("rid empty", '{"input_ids": [1], "rid": ""}', "rid must be a non-empty string"),
        _gen("rid long", '{"input_ids": [1], "rid": "' + "r" * 201 + '"}', "at most 200 characters"),
        _gen("rid dup", '{"input_ids": [[1], [2]], "rid": ["a", "a"]}', "rid values in a batch must be distinct"),
        _gen("rid count", '{"input_ids": [[1], [2]], "rid": ["a"]}', "rid has 1 entries for a batch of 2"),
        _gen("seed negative", '{"input_ids": [1], "synthetic_seed": -1}', "synthetic_seed must be in"),
        _gen("seed string", '{"input_ids": [1], "synthetic_seed": "1"}', "synthetic_seed must be an integer"),
        _gen("stream", '{"input_ids": [1], "stream": true}', "streaming is not supported"),
        _gen("logprob", '{"input_ids": [1], "return_logprob": true}', "return_logprob is not supported"),
        _gen("text", '{"text": "hello"}', "no tokenizer"),
        _gen("batch too big", '{"context_len": [1,1,1,1,1,1,1,1,1]}', "exceeds the maximum batch size"),
    ]


def _kv(name: str, body: str, fragment: str) -> Case:
    return one("wrong-type", f"kv_layout {name}", post("/specperf/kv_layout", body), 400, fragment)


def other_types() -> list[Case]:
    c, p = "wrong-type", "/specperf/profile"
    return [
        _kv("layout int", '{"layout": 5}', "unknown KV layout 5"),
        _kv("layout list", '{"layout": ["contiguous"]}', "unknown KV layout"),
        _kv("layout unknown", '{"layout": "swiss-cheese"}', "unknown KV layout 'swiss-cheese'"),
        _kv("level string", '{"layout": "fragmented", "level": "high"}', "level must be a number in [0, 1]"),
        _kv("level 1.5", '{"layout": "fragmented", "level": 1.5}', "level must be a number in [0, 1]"),
        _kv("level bool", '{"layout": "fragmented", "level": true}', "level must be a number"),
        _kv("seed negative", '{"layout": "fragmented", "seed": -4}', "seed must be in"),
        _kv("seed float", '{"layout": "fragmented", "seed": 1.5}', "seed must be an integer"),
        _kv("array", "[]", "must be a JSON object, got list"),
        one(c, "profile action pause", post(p, '{"action": "pause"}'), 400, "unknown profile action 'pause'"),
        one(c, "profile action int", post(p, '{"action": 5}'), 400, "unknown profile action 5"),
        one(c, "profile stop idle", post(p, '{"action": "stop"}'), 409, "the profiler is not running"),
    ]


def unknown_fields() -> list[Case]:
    c, g = "unknown-field", "/generate"
    return [
        one(c, "generate bogus", post(g, '{"input_ids": [1], "bogus": 1}'), 400, "unknown field(s) bogus"),
        one(c, "generate many", post(g, '{"input_ids": [1], "b": 1, "a": 2}'), 400, "unknown field(s) a, b"),
        one(c, "sampling top_p", post(g, '{"input_ids": [1], "sampling_params": {"top_p": 0.9}}'), 400, "unsupported sampling_params top_p"),
        one(c, "sampling stop", post(g, '{"input_ids": [1], "sampling_params": {"stop": ["x"]}}'), 400, "unsupported sampling_params stop"),
        one(c, "kv_layout extra", post("/specperf/kv_layout", '{"layout": "contiguous", "extra": 1}'), 400, "unknown field(s) extra"),
        one(c, "profile extra", post("/specperf/profile", '{"action": "start", "x": 1}'), 400, "the body must be"),
    ]


def routes() -> list[Case]:
    c = "route"
    return [
        one(c, "PUT /generate", req("PUT", "/generate", body=b"{}"), 405, "/generate accepts POST, not PUT"),
        one(c, "DELETE /generate", req("DELETE", "/generate"), 405, "accepts POST, not DELETE"),
        one(c, "PATCH kv_layout", req("PATCH", "/specperf/kv_layout", body=b"{}"), 405, "accepts POST, not PATCH"),
        one(c, "OPTIONS /generate", req("OPTIONS", "/generate"), 405, "accepts POST, not OPTIONS"),
        one(c, "TRACE /server_info", req("TRACE", "/server_info"), 405, "accepts GET, not TRACE"),
        one(c, "HEAD /health", req("HEAD", "/health"), 405, head_only=True),
        one(c, "HEAD unknown", req("HEAD", "/nope"), 404, head_only=True),
        one(c, "GET /generate", req("GET", "/generate"), 405, "/generate accepts POST, not GET"),
        one(c, "GET with query", req("GET", "/generate?x=1"), 405, "/generate accepts POST"),
        one(c, "POST /health", post("/health", "{}"), 405, "/health accepts GET, not POST"),
        one(c, "PUT unknown", req("PUT", "/nope"), 404, "no route PUT /nope"),
        one(c, "POST unknown", post("/specperf/unknown", "{}"), 404, "no route POST /specperf/unknown"),
    ]


def pipelined() -> list[Case]:
    c, good = "pipelined", req()
    smuggle = req("POST", "/flush_cache", headers=("Content-Length: 5", "Transfer-Encoding: chunked"),
                  length=False) + b"0\r\n\r\n" + req("GET", "/nope")
    return [
        one(c, "bad length then good", req("POST", "/flush_cache", headers=("Content-Length: x",)) + good, 400, "Content-Length 'x'"),
        one(c, "TE+CL smuggle", smuggle, 400, "both Transfer-Encoding and Content-Length"),
        one(c, "413 then good", post("/flush_cache", b" " * 70_000) + good, 413, "exceeds the limit"),
        one(c, "bad version then good", b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n" + good, 505, "not supported"),
    ]


def corpus() -> list[Case]:
    """Every case, in a fixed order."""
    groups = (methods, request_lines, headers, lengths, oversized, truncated, slow,
              malformed_json, not_an_object, deep_json, huge_numbers, generate_types,
              other_types, unknown_fields, routes, pipelined)
    return [case for group in groups for case in group()]
