"""A static call graph of an SGLang source tree, read with ``ast`` (nothing is imported).

Used by ``specperf sglang-check`` (which calls of a step method no phase covers) and by the
contract tests (each step method reaches its phase targets). Resolution is deliberately
simple and says how sure it is:

- ``exact``: ``f(...)`` of a function defined or imported (``from m import f``, also inside
  functions, also relative) in the module; ``mod.f(...)`` through an imported module;
  ``self.m(...)``/``cls.m(...)`` looked up along the bases of the class the method runs
  for (a subclass's step runs inherited methods with ``self`` being the subclass);
  ``super().m(...)``; ``Class.m(...)`` of an imported class.
- otherwise only the called attribute's name is known (``self.draft_worker.draft(...)``):
  :meth:`CallGraph.reach` and the checker match it by name against the targets they look
  for, and say so.

Calls inside ``raise`` and ``assert`` statements (error paths) and inside nested function
definitions (not run where they are defined) are left out.
"""

from __future__ import annotations

import ast
import builtins
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_specperf.engines.sglang.source import SourceLookupError, SourceTree, module_file

BUILTIN_NAMES = frozenset(dir(builtins))
_FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
_SKIPPED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Raise, ast.Assert)


@dataclass(frozen=True)
class Definition:
    """A function or method found in the tree."""

    target: str  # module.function or module.Class.method
    module: str
    owner: str | None  # module.Class for a method
    path: Path
    node: _FunctionNode

    @property
    def line(self) -> int:
        return self.node.lineno


@dataclass(frozen=True)
class Call:
    """One call expression inside a function body."""

    path: Path
    line: int
    callee: str  # the called expression as written, e.g. "self.draft_worker.draft"
    name: str  # the last name of it ("draft")
    resolved: str | None  # dotted target of the definition in the tree (exact resolution)
    node: ast.Call
    context: bool = False  # the call makes the context manager of a with statement


class CallGraph:
    """Definitions, imports and calls of one source tree (each file parsed once)."""

    def __init__(self, src: SourceTree) -> None:
        self.src = src
        self._imports: dict[str, dict[str, str]] = {}
        self._defs: dict[str, Definition | None] = {}

    # -- definitions ----------------------------------------------------------------------
    def definition(self, target: str) -> Definition | None:
        """The function or method ``target`` (defined in that very class), or None."""
        if target not in self._defs:
            self._defs[target] = self._find(target)
        return self._defs[target]

    def _find(self, target: str) -> Definition | None:
        try:
            found = self.src.find_callable(target)
        except (SourceLookupError, SyntaxError, OSError):
            return None
        tree = self.src.parse(found.path)
        module = target[: -len(found.target.split(".")[-1]) - 1]
        body: list[ast.stmt] = tree.body
        owner = None
        if found.owner is not None:
            module = module[: -len(found.owner) - 1]
            cls = _last(body, ast.ClassDef, found.owner)
            body = cls.body if cls is not None else []
            owner = f"{module}.{found.owner}"
        node = _last(body, (ast.FunctionDef, ast.AsyncFunctionDef), target.rsplit(".", 1)[1])
        if node is None:
            return None
        return Definition(target, module, owner, found.path, node)

    def locate(self, target: str) -> str | None:
        """Where ``target`` resolves at run time: itself when defined there; else, for a
        function re-exported or a class imported into the named module from another one
        (``from elsewhere import Class``), its definition there (the method looked up along
        the class's bases, as ``getattr`` does). None when it resolves nowhere."""
        if self.definition(target) is not None:
            return target
        followed = self._follow(target)
        if followed != target and self.definition(followed) is not None:
            return followed
        owner, _, name = target.rpartition(".")
        moved = self._follow(owner) if owner else owner
        if moved != owner and self.class_node(moved) is not None:
            found = self.find_method(moved, name)
            if found is not None and self.definition(found) is not None:
                return found
        return None

    def class_node(self, cls: str) -> ast.ClassDef | None:
        module, _, name = cls.rpartition(".")
        path = module_file(self.src.root, module)
        if path is None:
            return None
        try:
            node = _last(self.src.parse(path).body, ast.ClassDef, name)
        except (SyntaxError, OSError):
            return None
        return node if isinstance(node, ast.ClassDef) else None

    def bases(self, cls: str) -> list[str]:
        """``module.Class`` of each base of ``cls`` found in the tree, in order."""
        node = self.class_node(cls)
        if node is None:
            return []
        module = cls.rpartition(".")[0]
        out = []
        for base in node.bases:
            dotted = self.dotted(base, module)
            if dotted is not None and self.class_node(dotted) is not None:
                out.append(dotted)
        return out

    def mro(self, cls: str) -> list[str]:
        """``cls`` and its bases found in the tree, depth first (good enough for lookup)."""
        out: list[str] = []
        todo = [cls]
        while todo:
            c = todo.pop(0)
            if c not in out:
                out.append(c)
                todo[:0] = self.bases(c)
        return out

    def find_method(self, cls: str, name: str, *, after: str | None = None) -> str | None:
        """Where ``cls().name`` is defined (``after``: start past that class, for super())."""
        chain = self.mro(cls)
        if after is not None and after in chain:
            chain = chain[chain.index(after) + 1 :]
        for c in chain:
            node = self.class_node(c)
            if node is not None and _last(node.body, (ast.FunctionDef, ast.AsyncFunctionDef), name):
                return f"{c}.{name}"
        return None

    # -- imports and names ---------------------------------------------------------------------
    def imports(self, module: str) -> dict[str, str]:
        """Local name -> dotted name, for every import anywhere in ``module``."""
        table = self._imports.get(module)
        if table is None:
            table = self._imports[module] = self._read_imports(module)
        return table

    def _read_imports(self, module: str) -> dict[str, str]:
        path = module_file(self.src.root, module)
        if path is None:
            return {}
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        table: dict[str, str] = {}
        for node in ast.walk(self.src.parse(path)):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        table[a.asname] = a.name
                    else:
                        table[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    keep = parts[: len(parts) - node.level + 1]
                    base = ".".join([*keep, *([base] if base else [])])
                for a in node.names:
                    table[a.asname or a.name] = f"{base}.{a.name}" if base else a.name
        return table

    def dotted(self, expr: ast.expr, module: str) -> str | None:
        """The dotted name ``expr`` refers to in ``module`` (imports followed), if any."""
        if isinstance(expr, ast.Name):
            imported = self.imports(module).get(expr.id)
            if imported is not None:
                return self._follow(imported)
            path = module_file(self.src.root, module)
            if path is not None and _defines(self.src.parse(path).body, expr.id):
                return f"{module}.{expr.id}"
            return None
        if isinstance(expr, ast.Attribute):
            head = self.dotted(expr.value, module)
            if head is not None and module_file(self.src.root, head) is not None:
                return self._follow(f"{head}.{expr.attr}")
            if head is not None and self.class_node(head) is not None:
                return f"{head}.{expr.attr}"
        return None

    def _follow(self, dotted: str, depth: int = 4) -> str:
        """Follow re-exports: ``pkg.name`` imported into ``pkg`` from elsewhere."""
        for _ in range(depth):
            module, _, name = dotted.rpartition(".")
            path = module_file(self.src.root, module) if module else None
            if path is None or _defines(self.src.parse(path).body, name):
                return dotted
            nxt = self.imports(module).get(name)
            if nxt is None or nxt == dotted:
                return dotted
            dotted = nxt
        return dotted

    # -- calls -----------------------------------------------------------------------------------
    def calls(self, d: Definition, self_class: str | None = None) -> list[Call]:
        """The calls in ``d``'s body, in source order; ``self`` is a ``self_class``
        (default: the class defining ``d``)."""
        self_class = self_class or d.owner
        managers = {
            id(item.context_expr)
            for node in ast.walk(d.node)
            if isinstance(node, ast.With | ast.AsyncWith)
            for item in node.items
        }
        out = []
        for node in _walk_calls(d.node.body):
            callee = ast.unparse(node.func)
            name = node.func.attr if isinstance(node.func, ast.Attribute) else callee
            resolved = self._resolve(node.func, d, self_class)
            out.append(
                Call(d.path, node.lineno, callee, name, resolved, node, id(node) in managers)
            )
        return sorted(out, key=lambda c: (c.line, c.node.col_offset))

    def _resolve(self, func: ast.expr, d: Definition, self_class: str | None) -> str | None:
        if isinstance(func, ast.Name):
            dotted = self.dotted(func, d.module)
            return dotted if dotted and self.definition(dotted) else None
        if not isinstance(func, ast.Attribute):
            return None
        base = func.value
        if isinstance(base, ast.Name) and base.id in ("self", "cls") and self_class:
            return self.find_method(self_class, func.attr)
        if (
            isinstance(base, ast.Call)
            and isinstance(base.func, ast.Name)
            and base.func.id == "super"
            and self_class
            and d.owner
        ):
            return self.find_method(self_class, func.attr, after=d.owner)
        dotted = self.dotted(func, d.module)
        if dotted is None:
            return None
        owner = dotted.rpartition(".")[0]
        if self.class_node(owner) is not None:
            return self.find_method(owner, func.attr)
        return dotted if self.definition(dotted) else None

    # -- reachability --------------------------------------------------------------------------
    def reach(
        self,
        start: str,
        goals: Iterable[str],
        *,
        max_depth: int = 8,
        accept: Callable[[Call, str], bool] | None = None,
    ) -> dict[str, list[str]]:
        """Goals reachable from ``start``, each with the chain of calls that reaches it.

        Exact edges are followed through any function of the tree; an unresolved
        ``x.name(...)`` is taken as a call of every goal whose method name is ``name``.
        ``accept(call, goal)``: whether that call reaches the goal as a goal (a hook's
        condition); the call is followed either way.
        """
        goal_set = set(goals)
        by_name: dict[str, list[str]] = {}
        for g in goal_set:
            by_name.setdefault(g.rsplit(".", 1)[1], []).append(g)
        first = self.definition(start)
        if first is None:
            return {}
        found: dict[str, list[str]] = {}
        todo = deque([(first, first.owner, [start])])
        seen = {(start, first.owner)}
        while todo:
            d, self_class, chain = todo.popleft()
            if len(chain) > max_depth:
                continue
            for call, nxt, nxt_self in self._edges(d, self_class, by_name):
                path = [*chain, nxt.target]
                if (
                    nxt.target in goal_set
                    and nxt.target not in found
                    and (accept is None or accept(call, nxt.target))
                ):
                    found[nxt.target] = path
                if (nxt.target, nxt_self) not in seen:
                    seen.add((nxt.target, nxt_self))
                    todo.append((nxt, nxt_self, path))
        return found

    def _edges(
        self, d: Definition, self_class: str | None, by_name: dict[str, list[str]]
    ) -> Iterator[tuple[Call, Definition, str | None]]:
        for call in self.calls(d, self_class):
            targets = [call.resolved] if call.resolved else by_name.get(call.name, [])
            via_self = call.callee.startswith(("self.", "cls.", "super()."))
            for t in targets:
                nxt = self.definition(t)
                if nxt is not None:
                    yield call, nxt, (self_class if via_self and call.resolved else nxt.owner)


def _walk_calls(body: list[ast.stmt]) -> Iterator[ast.Call]:
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, _SKIPPED):
            continue
        if isinstance(node, ast.Call):
            yield node
        todo.extend(ast.iter_child_nodes(node))


def _last(body: list[ast.stmt], kind: type | tuple[type, ...], name: str) -> Any:
    found = None
    for node in body:
        if isinstance(node, kind) and getattr(node, "name", None) == name:
            found = node
    return found


def _defines(body: list[ast.stmt], name: str) -> bool:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return True
    return False
