"""Command line and environment of ``python -m sglang.launch_server`` for a measured run.

Pass-through arguments (``--specperf-server-arg``) are checked before anything starts:

- flags the plugin controls (``--host``, ``--port``) and flags that have their own
  specperf option (``--model-path``, ``--speculative-draft-model-path`` and their
  aliases) are refused;
- every other flag must be one SGLang accepts. The accepted set is read from the
  installed SGLang's source with ``ast`` (``ServerArgs`` is assembled from the
  ``A[T, "help"]`` / ``A[T, Arg(...)]`` fields in ``sglang/srt/arg_groups/fields/``, plus
  the few ``parser.add_argument`` calls in ``sglang/srt/server_args.py``), without
  importing SGLang. Flags must be spelled in full (argparse would accept an unambiguous
  prefix; we refuse it so that a typo cannot silently mean another flag). If the source
  layout is not recognised (fewer than :data:`MIN_FLAGS` flags found), the check is
  skipped and SGLang's own error appears in the server log tail.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pytest_specperf.engines.env import ENV_RUN_DIR, ENV_SGLANG_PLUGIN
from pytest_specperf.server.protocol import BackendUnavailable

#: Flags the plugin sets itself.
RESERVED = {
    "--host": "the server always listens on 127.0.0.1 (use --specperf-attach URL to attach "
    "to a server elsewhere)",
    "--port": "the plugin picks a free port",
}
#: Flags that have their own specperf option.
MODEL_FLAGS = {
    "--model-path": "--specperf-model",
    "--model": "--specperf-model",
    "--speculative-draft-model-path": "--specperf-draft-model",
    "--speculative-draft-model": "--specperf-draft-model",
}
#: Flags always added by the launcher.
FORCED = ("--enable-metrics",)
#: Environment of the server, on top of the caller's.
DEVICE_TIMER_ENV = "SGLANG_ENABLE_METRICS_DEVICE_TIMER"
PLUGIN_WHITELIST_ENV = "SGLANG_PLUGINS"
PLUGIN_NAME = "specperf"
#: Below this many flags, the source layout is not what we expect: skip validation.
MIN_FLAGS = 100


def split_server_args(args: Iterable[str]) -> list[str]:
    """argv tokens of the pass-through arguments.

    Each ``--specperf-server-arg`` is one token (``--page-size=16``) or a value following
    a flag token. A token whose flag part contains whitespace (``"--page-size 16"``, as
    written in an ini file) is split like a shell would.
    """
    out: list[str] = []
    for arg in args:
        head = arg.split("=", 1)[0]
        if arg.startswith("--") and any(c.isspace() for c in head):
            out.extend(shlex.split(arg))
        else:
            out.append(arg)
    return out


def flag_of(token: str) -> str | None:
    """The flag of an argv token (``--a=b`` -> ``--a``), None for a value."""
    if not token.startswith("--") or token == "--":
        return None
    return token.split("=", 1)[0]


def has_flag(tokens: Sequence[str], *flags: str) -> bool:
    return any(flag_of(t) in flags for t in tokens)


def flag_value(tokens: Sequence[str], flag: str) -> str | None:
    """The value given to ``flag`` (``--f=v`` or ``--f v``; the last one wins), if any."""
    value = None
    for i, token in enumerate(tokens):
        if flag_of(token) != flag:
            continue
        if "=" in token:
            value = token.split("=", 1)[1]
        elif i + 1 < len(tokens) and flag_of(tokens[i + 1]) is None:
            value = tokens[i + 1]
    return value


def config_value(tokens: Sequence[str], key: str) -> str | None:
    """``key`` (``a_b`` or ``a-b``) from the YAML file of ``--config``, if readable."""
    path = flag_value(tokens, "--config")
    if not path:
        return None
    import yaml

    try:
        data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # SGLang reports an unreadable config itself
    if not isinstance(data, dict):
        return None
    value = data.get(key, data.get(key.replace("_", "-")))
    return value if isinstance(value, str) else None


def known_flags(sglang_root: Path | None) -> frozenset[str] | None:
    """Every ``--flag`` SGLang's launch_server accepts, read from its source with ``ast``.

    None when SGLang is not installed or its source layout is not recognised.
    """
    if sglang_root is None:
        return None
    flags: set[str] = set()
    fields_dir = sglang_root / "srt" / "arg_groups" / "fields"
    try:
        for path in sorted(fields_dir.glob("*.py")):
            flags |= _field_flags(ast.parse(path.read_text(encoding="utf-8")))
        server_args = sglang_root / "srt" / "server_args.py"
        flags |= _add_argument_flags(ast.parse(server_args.read_text(encoding="utf-8")))
    except (OSError, SyntaxError, ValueError):
        return None
    return frozenset(flags) if len(flags) >= MIN_FLAGS else None


def _field_flags(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for st in cls.body:
            if not isinstance(st, ast.AnnAssign) or not isinstance(st.target, ast.Name):
                continue
            ann = st.annotation
            if not (
                isinstance(ann, ast.Subscript)
                and isinstance(ann.value, ast.Name)
                and ann.value.id == "A"
                and isinstance(ann.slice, ast.Tuple)
                and len(ann.slice.elts) >= 2
            ):
                continue
            meta = ann.slice.elts[1]
            name = "--" + st.target.id.replace("_", "-")
            if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
                out.add(name)
                continue
            if not (
                isinstance(meta, ast.Call)
                and isinstance(meta.func, ast.Name)
                and meta.func.id == "Arg"
            ):
                continue
            kw = {k.arg: k.value for k in meta.keywords if k.arg}
            if _const(kw.get("no_cli")) is True:
                continue
            cli = _const(kw.get("cli_name"))
            if isinstance(cli, str):
                name = cli
            out.add(name)
            aliases = kw.get("aliases")
            if aliases is not None:
                with contextlib.suppress(ValueError):
                    out.update(a for a in ast.literal_eval(aliases) if isinstance(a, str))
            action = kw.get("action")
            if action is not None and ast.unparse(action).endswith("BooleanOptionalAction"):
                out.add("--no-" + name[2:])
    return out


def _add_argument_flags(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            for a in node.args:
                v = _const(a)
                if isinstance(v, str) and v.startswith("--"):
                    out.add(v)
    return out


def _const(node: ast.expr | None) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def check_server_args(
    tokens: Sequence[str], known: frozenset[str] | None, version: str | None
) -> None:
    """Raise :class:`BackendUnavailable` for a reserved, duplicated-option or unknown flag."""
    for token in tokens:
        flag = flag_of(token)
        if flag is None:
            continue
        if flag in RESERVED:
            raise BackendUnavailable(
                f"--specperf-server-arg {token!r} sets {flag}, which the plugin controls: "
                f"{RESERVED[flag]}"
            )
        if flag in MODEL_FLAGS:
            raise BackendUnavailable(
                f"--specperf-server-arg {token!r}: give the model with {MODEL_FLAGS[flag]} "
                f"instead of {flag}"
            )
        if known is not None and flag not in known:
            close = difflib.get_close_matches(flag, sorted(known), n=3, cutoff=0.7)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise BackendUnavailable(
                f"--specperf-server-arg {token!r}: sglang {version or '(unknown version)'} "
                f"has no flag {flag} (flags must be spelled in full){hint} "
                "See `python -m sglang.launch_server --help`."
            )


def build_command(
    python: str, *, model: str, draft_model: str | None, port: int, server_args: Sequence[str]
) -> list[str]:
    cmd = [python, "-m", "sglang.launch_server", "--model-path", model]
    if draft_model:
        cmd += ["--speculative-draft-model-path", draft_model]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    cmd += [f for f in FORCED if not has_flag(server_args, f)]
    cmd += list(server_args)
    return cmd


#: SGLang's switch of its CPU engine (``is_cpu()``), read from the server's environment.
CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"


def server_device(tokens: Sequence[str], base_env: Mapping[str, str]) -> str | None:
    """The device the server will run on as far as its command line and environment say:
    ``cpu`` under SGLang's CPU engine, else ``--device`` (None: SGLang picks it)."""
    if base_env.get(CPU_ENGINE_ENV, "").strip().lower() in ("1", "true", "yes"):
        return "cpu"
    device = flag_value(tokens, "--device") or config_value(tokens, "device")
    return device.strip().lower() if device else None


def build_env(
    run_dir: Path, base_env: Mapping[str, str], server_args: Sequence[str] = ()
) -> dict[str, str]:
    """Variables the server needs on top of ``base_env`` (the caller's environment).

    ``SGLANG_ENABLE_METRICS_DEVICE_TIMER=1`` (SGLang's GPU-time metrics, the cross-check's
    other side) only for a CUDA server (``--device`` cuda or unset) and when the caller did
    not set it: SGLang's device timer uses ``Event(enable_timing=True)``, which
    ``torch.cpu.Event`` does not take, and a CPU server dies at its first forward with it.
    """
    env = {
        ENV_SGLANG_PLUGIN: "1",
        ENV_RUN_DIR: str(run_dir),
    }
    if DEVICE_TIMER_ENV not in base_env and server_device(server_args, base_env) in (
        None,
        "cuda",
    ):
        env[DEVICE_TIMER_ENV] = "1"
    whitelist = base_env.get(PLUGIN_WHITELIST_ENV, "")
    names = [x.strip() for x in whitelist.split(",") if x.strip()]
    if names and PLUGIN_NAME not in names:
        env[PLUGIN_WHITELIST_ENV] = ",".join([*names, PLUGIN_NAME])
    return env
