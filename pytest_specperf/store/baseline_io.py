"""Bounded, race-safe I/O of baseline files: read with limits, lock, write atomically.

Reading refuses, before any YAML is built and naming the file: a file over the size
limit, a path that is not a regular file (a FIFO, a directory, a device: never opened for
a blocking read), a dangling or looping symbolic link, and YAML whose shape is beyond the
limits (node count, nesting depth, alias count and alias expansion, integer digits, tags
other than the plain core ones). The shape is checked on the parser's event stream, which
holds one event at a time and stops at the node limit, so a hostile file costs no more
memory than its own size and no more time than the node limit's worth of events.

Writing goes through a temporary file ``.<name>.<random>.tmp`` beside the real file
(through a symbolic link, to its target) and an atomic rename, under an advisory lock
``.<name>.lock`` (``filelock``: flock on POSIX, released by the kernel when the holder
dies, so a killed update can never leave a lock that blocks the next one). The lock's
holder (pid, host, time) is written to ``.<name>.lock.holder`` for the timeout message.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import glob
import json
import math
import os
import platform
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Default largest baseline file read (a case takes about 4 KB, so this is ~2000 cases).
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
#: Environment variable that raises (or lowers) the size limit, in MiB.
ENV_MAX_MB = "SPECPERF_BASELINE_MAX_MB"
#: How a user raises the size limit (the pytest option wins over the variable).
RAISE_LIMIT = f"-o specperf_baseline_max_mb=<MiB> (or {ENV_MAX_MB}=<MiB>)"
#: Deepest nesting of mappings and lists (the schema needs 9).
MAX_DEPTH = 32
#: Most aliases (``*name``) a file may use; the writer never emits any.
MAX_ALIASES = 100
#: Most nodes that aliases may add when expanded (what a reader that copies sees).
MAX_ALIAS_NODES = 10_000
#: Most YAML nodes (scalars, collections, aliases) a file of the default size limit may
#: hold: a case of 5 runs takes about 800 (one run about 200), so this is about 125 cases
#: of 5 runs. Counted while the file is parsed, which stops at the limit: a hostile file
#: of any size within the byte limit costs at most this many nodes' work (well under a
#: second; measured in docs/faults.md).
MAX_NODES = 100_000
#: Most digits of an integer (Python refuses to parse more than 4300).
MAX_INT_DIGITS = 20
#: Seconds an update waits for another update's lock before giving up.
LOCK_TIMEOUT_S = 60.0
#: The only explicit YAML tags a baseline file may carry (plain data).
_CORE = "tag:yaml.org,2002:"
ALLOWED_TAGS = frozenset(_CORE + t for t in ("str", "int", "float", "bool", "null", "seq", "map"))
_RERECORD = "move the file away and re-record with --specperf-update-baselines"
_MIB = 1024 * 1024


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file and the fix."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def resolve_max_bytes(path: Path, max_bytes: int | None) -> int:
    """``max_bytes``, else the limit from ``SPECPERF_BASELINE_MAX_MB``, else 8 MiB."""
    if max_bytes is not None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        return max_bytes
    raw = os.environ.get(ENV_MAX_MB)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_BYTES
    try:
        mb = float(raw)
    except ValueError:
        mb = math.nan
    if not math.isfinite(mb) or mb <= 0:
        raise BaselineError(
            path, f"{ENV_MAX_MB}={raw[:40]!r} is not a positive number of MiB; set it to e.g. 32"
        )
    return max(1, int(mb * _MIB))


def max_nodes_for(max_bytes: int) -> int:
    """The node limit that goes with a byte limit: ``MAX_NODES``, raised in proportion
    when the byte limit is raised above its default (never lowered with it)."""
    return max(MAX_NODES, MAX_NODES * max_bytes // DEFAULT_MAX_BYTES)


# -- reading -----------------------------------------------------------------------------


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def real_target(path: Path) -> Path | None:
    """Where ``path`` leads (itself, or a symbolic link's final target); ``None`` if
    nothing is there. A dangling or looping link is a ``BaselineError`` naming it."""
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise BaselineError(path, f"cannot read: {e.strerror}") from None
    if not stat.S_ISLNK(lst.st_mode):
        return path
    try:
        os.stat(path)
    except FileNotFoundError:
        raise BaselineError(
            path,
            f"is a symbolic link to {os.readlink(path)!r}, which does not exist; point the "
            "link at a baseline file, or remove it to record a new one",
        ) from None
    except OSError as e:
        why = "a loop of symbolic links" if e.errno == errno.ELOOP else e.strerror
        raise BaselineError(path, f"is a symbolic link that cannot be followed: {why}") from None
    return Path(os.path.realpath(path))


def _not_regular(path: Path, target: Path, mode: int) -> BaselineError:
    via = f" (the link's target {target})" if target != path else ""
    return BaselineError(
        path,
        f"is {_kind(mode)}{via}, not a regular file; a baseline file must be a plain YAML "
        "file: point --specperf-baselines at a directory of baseline files",
    )


def _too_big(path: Path, size: int, limit: int) -> BaselineError:
    return BaselineError(
        path,
        f"is {size / _MIB:.1f} MiB, over the {limit / _MIB:g} MiB limit for a baseline file "
        f"(a case takes about 4 KB); if it really is one, raise the limit with "
        f"{RAISE_LIMIT}, otherwise {_RERECORD}",
    )


def _read_at_most(fh: Any, limit: int) -> bytes:
    """Read to the end or to ``limit`` bytes, in chunks (no buffer of the limit's size)."""
    chunks, total = [], 0
    while total < limit:
        chunk = fh.read(min(64 * 1024, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def read_bounded(path: Path, max_bytes: int) -> str | None:
    """The text of ``path`` (through a link), ``None`` if there is no file; never blocks
    on a FIFO or reads more than ``max_bytes + 1`` bytes."""
    target = real_target(path)
    if target is None:
        return None
    try:
        st = os.stat(target)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, target, st.st_mode)
        if st.st_size > max_bytes:
            raise _too_big(path, st.st_size, max_bytes)
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        return None  # removed since the link was followed: no file
    except OSError as e:
        raise BaselineError(path, f"cannot read: {e.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        fst = os.fstat(fh.fileno())
        if not stat.S_ISREG(fst.st_mode):  # replaced between stat and open
            raise _not_regular(path, target, fst.st_mode)
        data = _read_at_most(fh, max_bytes + 1)
    if len(data) > max_bytes:  # grew since the stat
        raise _too_big(path, len(data), max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BaselineError(
            path, f"is not UTF-8 text (byte {e.start}); a baseline file is YAML: {_RERECORD}"
        ) from None


def _loader() -> Any:
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


#: Plain scalars that YAML 1.1 (PyYAML's resolver) reads as a decimal float or integer,
#: and that Python's ``float``/``int`` read the same way.
_PLAIN_FLOAT = re.compile(r"[-+]?[0-9]+\.[0-9]*(?:[eE][-+][0-9]+)?")
_PLAIN_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_SCALAR_TAGS = frozenset(_CORE + t for t in ("str", "int", "float", "bool", "null"))
_NO_KEY = object()


class _Builder:
    """Checks one event stream against the limits and builds its plain data in the same
    pass: scalars resolved and constructed as ``yaml.safe_load`` does (the same resolver
    and constructors), mappings and lists as dicts and lists, an alias as the anchored
    object itself (shared, as ``safe_load`` shares it; its expansion is bounded)."""

    def __init__(self, path: Path, max_nodes: int) -> None:
        import yaml

        self.path = path
        self.max_nodes = max_nodes
        self.resolve: Any = yaml.resolver.Resolver().resolve
        self.constructor = yaml.constructor.SafeConstructor()
        self.node = yaml.ScalarNode
        #: per open collection: [container, pending mapping key, anchor, expanded size]
        self.open: list[list[Any]] = []
        #: anchor -> (object, expanded size); a collection's only once it is closed
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.nodes = 0
        self.aliases = 0
        self.alias_nodes = 0
        self.documents = 0
        self.root: Any = None

    def fail(self, what: str, event: Any, fix: str = _RERECORD) -> BaselineError:
        mark = getattr(event, "start_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        return BaselineError(self.path, f"refused: {what}{where}; {fix}")

    def _count(self, event: Any) -> None:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise self.fail(
                f"more than {self.max_nodes} YAML nodes (a case of 5 runs takes about 800)",
                event,
                f"if it really is one baseline file, raise the limit with {RAISE_LIMIT} (the "
                f"node limit grows with it), otherwise {_RERECORD}",
            )

    def _tag(self, event: Any, allowed: frozenset[str] | str) -> None:
        tag = event.tag
        if tag is None or tag == "!":
            return
        if tag not in ALLOWED_TAGS:
            raise self.fail(
                f"the file uses a YAML tag that safe loading does not allow ({str(tag)[:80]!r})",
                event,
                f"baselines hold plain data only: delete the tagged entry, or {_RERECORD}",
            )
        if tag not in allowed and tag != allowed:
            raise self.fail(f"the YAML tag {tag!r} does not fit its node", event)

    def _place(self, obj: Any, size: int, event: Any) -> None:
        """Put ``obj`` (``size`` nodes once expanded) into the open collection."""
        if not self.open:
            self.root = obj
            return
        top = self.open[-1]
        top[3] += size
        container = top[0]
        if type(container) is list:
            container.append(obj)
        elif top[1] is _NO_KEY:
            if isinstance(obj, (dict, list)):
                raise self.fail("a mapping key that is a mapping or a list", event)
            top[1] = obj
        else:
            container[top[1]] = obj
            top[1] = _NO_KEY

    def scalar(self, event: Any) -> None:
        self._count(event)
        value, tag = event.value, event.tag
        if tag is None and event.implicit[0] and len(value) <= MAX_INT_DIGITS:
            # plain decimal numbers (nearly every scalar of a baseline file): what the
            # resolver and constructor give them, without their general path
            if _PLAIN_FLOAT.fullmatch(value):
                self._number(float(value), event)
                return
            if _PLAIN_INT.fullmatch(value):
                self._number(int(value), event)
                return
        if tag is None or tag == "!":
            tag = self.resolve(self.node, value, event.implicit)
        else:
            self._tag(event, _SCALAR_TAGS)
        if tag == _CORE + "str":
            obj: Any = value
        elif tag == _CORE + "int" and len(value) > MAX_INT_DIGITS:
            raise self.fail(
                f"an integer of {len(value)} characters (at most {MAX_INT_DIGITS} digits)", event
            )
        else:
            construct: Any = self.constructor.yaml_constructors.get(tag)
            if construct is None:  # the merge (<<) and value (=) keys of YAML 1.1
                raise self.fail(f"the YAML key {value[:20]!r} (resolved as {tag})", event)
            obj = construct(self.constructor, self.node(tag, value))
        if event.anchor:
            self.anchors[event.anchor] = (obj, 1)
        self._place(obj, 1, event)

    def _number(self, obj: float, event: Any) -> None:
        if event.anchor:
            self.anchors[event.anchor] = (obj, 1)
        self._place(obj, 1, event)

    def start(self, event: Any, mapping: bool) -> None:
        self._count(event)
        self._tag(event, _CORE + ("map" if mapping else "seq"))
        if len(self.open) >= MAX_DEPTH:
            raise self.fail(f"nesting deeper than {MAX_DEPTH} levels", event)
        obj: Any = {} if mapping else []
        self._place(obj, 0, event)
        self.open.append([obj, _NO_KEY, event.anchor, 1])

    def end(self, event: Any) -> None:
        obj, _, anchor, size = self.open.pop()
        if anchor:
            self.anchors[anchor] = (obj, size)
        if self.open:
            self.open[-1][3] += size

    def alias(self, event: Any) -> None:
        self._count(event)
        self.aliases += 1
        if self.aliases > MAX_ALIASES:
            raise self.fail(f"more than {MAX_ALIASES} YAML aliases", event)
        found = self.anchors.get(event.anchor)
        if found is None:
            raise self.fail(
                f"the alias *{str(event.anchor)[:40]} refers to no anchor before it, or to a "
                "collection that contains it",
                event,
            )
        obj, size = found
        self.alias_nodes += size
        if self.alias_nodes > MAX_ALIAS_NODES:
            raise self.fail(
                f"YAML aliases that expand to more than {MAX_ALIAS_NODES} nodes (an alias bomb?)",
                event,
            )
        self._place(obj, size, event)

    def document(self, event: Any) -> None:
        self.documents += 1
        if self.documents > 1:
            raise self.fail("more than one YAML document in the file", event)


def parse_yaml(text: str, path: Path, max_nodes: int = MAX_NODES) -> Any:
    """Plain data from ``text``, as ``yaml.safe_load`` gives it, checked against the
    limits (node count, depth, aliases and their expansion, integer digits, tags) on the
    parser's event stream while it is built: the stream stops at the first limit, so a
    hostile file costs at most ``max_nodes`` events whatever its size. ``BaselineError``
    names the file, the line and the fix."""
    import yaml

    b = _Builder(path, max_nodes)
    handlers: dict[type, Any] = {
        yaml.ScalarEvent: b.scalar,
        yaml.MappingStartEvent: lambda e: b.start(e, True),
        yaml.SequenceStartEvent: lambda e: b.start(e, False),
        yaml.MappingEndEvent: b.end,
        yaml.SequenceEndEvent: b.end,
        yaml.AliasEvent: b.alias,
        yaml.DocumentStartEvent: b.document,
    }
    try:
        for event in yaml.parse(text, Loader=_loader()):
            handle = handlers.get(type(event))
            if handle is not None:
                handle(event)
    except yaml.YAMLError as e:
        if "flow level" in str(e) or "indent level" in str(e):  # libyaml's own depth limit
            raise BaselineError(
                path, f"refused: nesting deeper than {MAX_DEPTH} levels; {_RERECORD}"
            ) from None
        raise BaselineError(
            path, f"malformed YAML: {str(e)[:600]}; fix the file, or {_RERECORD}"
        ) from None
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as e:
        raise BaselineError(
            path, f"cannot be read as plain data: {type(e).__name__}: {str(e)[:200]}; {_RERECORD}"
        ) from None
    return b.root


# -- writing -----------------------------------------------------------------------------


class FlowMap(dict[str, Any]):
    """A mapping written on one line (``{at: ..., pid: ...}``)."""


def _dumper() -> Any:
    import yaml

    base = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

    class Dumper(base):  # type: ignore[misc, valid-type]
        def ignore_aliases(self, data: Any) -> bool:
            return True  # self-contained entries: no &anchors / *aliases

    def number_list(data: list[Any]) -> bool:
        return all(
            (isinstance(x, (int, float)) and not isinstance(x, bool))
            or (isinstance(x, list) and number_list(x))
            for x in data
        )

    def represent_list(dumper: Any, data: list[Any]) -> Any:
        flow = number_list(data)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)

    def represent_flow_map(dumper: Any, data: FlowMap) -> Any:
        return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)

    Dumper.add_representer(list, represent_list)
    Dumper.add_representer(FlowMap, represent_flow_map)
    return Dumper


def dump_yaml(data: Any) -> str:
    """YAML text of plain ``data``: key order as given, number lists on one line."""
    import yaml

    out: str = yaml.dump(
        data,
        Dumper=_dumper(),
        sort_keys=False,
        default_flow_style=False,
        width=1 << 20,
        allow_unicode=True,
    )
    return out


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}.lock"


def _holder_path(target: Path) -> Path:
    return target.parent / f".{target.name}.lock.holder"


def _holder_text(target: Path) -> str:
    try:
        with open(_holder_path(target), "rb") as fh:
            info = json.loads(fh.read(4096))
        return f"held by pid {info['pid']} on host {info['host']} since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


@contextlib.contextmanager
def locked(target: Path, timeout: float) -> Iterator[None]:
    """Hold the advisory lock of ``target`` (waiting at most ``timeout`` seconds)."""
    import filelock

    lock = filelock.FileLock(str(lock_path(target)), timeout=timeout)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise BaselineError(
            target,
            f"another update holds the lock {lock_path(target)} ({_holder_text(target)}); "
            f"waited {timeout:g} s. Let it finish and run again (the lock ends with its "
            "process, so a killed update cannot leave it behind)",
        ) from None
    try:
        now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
        info = {"pid": os.getpid(), "host": platform.node(), "since": now.isoformat()}
        with contextlib.suppress(OSError):
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(_holder_path(target), flags, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(info))
        yield
    finally:
        with contextlib.suppress(OSError):
            _holder_path(target).unlink()
        lock.release()


def temp_prefix(target: Path) -> str:
    return f".{target.name}."


TEMP_SUFFIX = ".tmp"


def remove_stale_temps(target: Path) -> list[str]:
    """Remove temporary files of this writer's naming left by killed updates (call under
    the lock: no live writer owns one then); their names."""
    pattern = glob.escape(temp_prefix(target)) + "*" + TEMP_SUFFIX
    removed = []
    for p in sorted(target.parent.glob(pattern)):
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(p).st_mode):
                p.unlink()
                removed.append(p.name)
    return removed


def write_all(fh: Any, data: bytes) -> None:
    fh.write(data)


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort: not every system can)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(target: Path, text: str) -> None:
    """Replace ``target`` by ``text`` atomically; the temporary file is removed on any
    exception, so a failed write leaves the old file and nothing else."""
    mode = 0o644
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(os.stat(target).st_mode)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target), suffix=TEMP_SUFFIX, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write_all(fh, text.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)
