"""Server processes (launch, readiness, teardown), the HTTP client for SGLang's API, and
the backend protocol the engines implement (``server.protocol``, standard library only:
it is imported in every SGLang process)."""
