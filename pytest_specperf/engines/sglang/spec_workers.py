"""Which worker class ``SpeculativeAlgorithm.create_worker`` returns, read from the source.

``sglang/srt/speculative/spec_info.py`` decides with an ``if``/``elif`` chain on the enum's
``is_*()`` predicates (and on server arguments such as ``enable_multi_layer_eagle``). This
module evaluates that chain with ``ast`` for every enum member and alias, for every value
of the server arguments it tests, without importing SGLang: the contract tests compare
the result with :mod:`.algorithms`, and ``specperf sglang-check`` shows it for a fork.

Only the shapes SGLang uses are understood: predicates that return ``self == A.X``,
``self != A.X``, ``self in (A.X, ...)``, ``self.is_y()`` and ``and``/``or``/``not`` of those;
in ``create_worker``, ``if`` tests over those predicates and boolean server arguments
(``cfg.name``), ``return Name`` of an imported class. Any other test counts as false (the
out-of-tree platform hook, for example); :class:`SpecInfoError` when nothing is found.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass

from pytest_specperf.engines.sglang.callgraph import CallGraph
from pytest_specperf.engines.sglang.source import SourceLookupError

SPEC_INFO = "sglang.srt.speculative.spec_info"
SPEC_REGISTRY = "sglang.srt.speculative.spec_registry"
ENUM = "SpeculativeAlgorithm"
STEP = "forward_batch_generation"


class SpecInfoError(LookupError):
    """The source has no ``create_worker`` this module can read."""


@dataclass(frozen=True)
class WorkerChoice:
    """The worker an algorithm gets under some values of the server arguments tested."""

    algorithm: str
    worker: str | None  # module.Class, None: no worker (an error path)
    step: str | None  # the forward_batch_generation the worker runs (maybe inherited)
    flags: tuple[tuple[str, bool], ...]  # the server arguments that lead here

    @property
    def condition(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.flags) or "always"


class _Evaluator:
    def __init__(self, cls: ast.ClassDef) -> None:
        self.methods = {
            n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }

    def members(self, cls: ast.ClassDef) -> list[str]:
        out = []
        for n in cls.body:
            if isinstance(n, ast.Assign):
                out += [t.id for t in n.targets if isinstance(t, ast.Name) and t.id.isupper()]
        return out

    def test(self, expr: ast.expr, member: str, flags: dict[str, bool]) -> bool:
        if isinstance(expr, ast.BoolOp):
            values = [self.test(v, member, flags) for v in expr.values]
            return all(values) if isinstance(expr.op, ast.And) else any(values)
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            return not self.test(expr.operand, member, flags)
        if (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Attribute)
            and isinstance(expr.func.value, ast.Name)
            and expr.func.value.id == "self"
        ):
            return self.predicate(expr.func.attr, member, flags)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            return flags.get(expr.attr, False)
        if isinstance(expr, ast.Compare) and len(expr.ops) == 1:
            left, right, op = expr.left, expr.comparators[0], expr.ops[0]
            if isinstance(left, ast.Name) and left.id == "self":
                names = _member_names(right)
                if isinstance(op, ast.Eq | ast.In):
                    return member in names
                if isinstance(op, ast.NotEq | ast.NotIn):
                    return member not in names
        return False

    def predicate(self, name: str, member: str, flags: dict[str, bool]) -> bool:
        fn = self.methods.get(name)
        if fn is None:
            return False
        returns = [s for s in fn.body if isinstance(s, ast.Return) and s.value is not None]
        return bool(returns) and self.test(returns[0].value, member, flags)  # type: ignore[arg-type]


def _member_names(expr: ast.expr) -> set[str]:
    elts = expr.elts if isinstance(expr, ast.Tuple | ast.List | ast.Set) else [expr]
    return {e.attr for e in elts if isinstance(e, ast.Attribute)}


def _flag_names(fn: ast.FunctionDef) -> list[str]:
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.If):
            for sub in ast.walk(node.test):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id in ("cfg", "server_args")
                ):
                    names.add(sub.attr)
    return sorted(names)


def _chosen(
    body: list[ast.stmt], ev: _Evaluator, member: str, flags: dict[str, bool]
) -> ast.expr | None:
    """The returned expression for ``member`` (None: falls through or raises)."""
    for stmt in body:
        if isinstance(stmt, ast.Return):
            return stmt.value
        if isinstance(stmt, ast.Raise):
            return None
        if isinstance(stmt, ast.If):
            branch = stmt.body if ev.test(stmt.test, member, flags) else stmt.orelse
            found = _chosen(branch, ev, member, flags)
            if found is not None or _ends(branch):
                return found
    return None


def _ends(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], ast.Return | ast.Raise)


def _aliases(graph: CallGraph) -> dict[str, str]:
    """``_RESERVED_ALIASES`` of the registry: each maps to EAGLE in ``from_string``."""
    try:
        tree = graph.src.module(SPEC_REGISTRY)
    except (SourceLookupError, SyntaxError, OSError):
        return {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_RESERVED_ALIASES" for t in node.targets
        ):
            names = [c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)]
            return {str(n): "EAGLE" for n in names if isinstance(n, str)}
    return {}


def worker_choices(graph: CallGraph) -> list[WorkerChoice]:
    """Every (algorithm, server-argument values) -> worker of the tree's ``spec_info``."""
    try:
        tree = graph.src.module(SPEC_INFO)
    except (SourceLookupError, SyntaxError, OSError) as e:
        raise SpecInfoError(f"cannot read {SPEC_INFO}: {e}") from None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == ENUM), None)
    create = None if cls is None else _method(cls, "create_worker")
    if cls is None or create is None:
        raise SpecInfoError(f"{SPEC_INFO} has no {ENUM}.create_worker")
    ev = _Evaluator(cls)
    members = [m for m in ev.members(cls) if m != "NONE"]
    names = {m: m for m in members} | _aliases(graph)
    flag_names = _flag_names(create)
    out: list[WorkerChoice] = []
    for name, member in names.items():
        found: dict[str | None, dict[str, bool]] = {}
        for values in itertools.product((False, True), repeat=len(flag_names)):
            flags = dict(zip(flag_names, values))
            worker = _worker(graph, _chosen(create.body, ev, member, flags))
            found.setdefault(worker, flags)
        for worker, flags in found.items():
            step = graph.find_method(worker, STEP) if worker else None
            used = tuple(flags.items()) if len(found) > 1 else ()
            out.append(WorkerChoice(name, worker, step, used))
    return out


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for n in cls.body:
        if isinstance(n, ast.FunctionDef) and n.name == name:
            return n
    return None


def _worker(graph: CallGraph, expr: ast.expr | None) -> str | None:
    if not isinstance(expr, ast.Name):
        return None
    return graph.dotted(expr, SPEC_INFO)
