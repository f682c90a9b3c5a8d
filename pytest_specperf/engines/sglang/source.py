"""Read the installed SGLang's source without importing it.

Importing ``sglang.srt`` pulls CUDA kernels, triton and a few hundred MB of
dependencies, so nothing on the plugin side (pytest process, CI contract tests)
imports it. Instead the package is located with ``importlib.util.find_spec``
(which, for a top-level package, only searches ``sys.path`` and executes no
code of the package) and its files are parsed with :mod:`ast`.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path


class SourceLookupError(LookupError):
    """A dotted target could not be found in the SGLang source tree."""


def sglang_root() -> Path | None:
    """Directory of the installed ``sglang`` package, or None if it is not installed."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location)
        if (path / "srt").is_dir():
            return path
    return None


def installed_version() -> str | None:
    """Version of the installed ``sglang`` distribution (package metadata, no import)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def parse_file(path: Path) -> ast.Module:
    """Parse one source file (not cached: callers that parse often keep the tree)."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def module_file(root: Path, module: str) -> Path | None:
    """File of dotted ``module`` (``sglang.srt.x``) under the package ``root``, if any."""
    parts = module.split(".")
    if not parts or parts[0] != "sglang":
        return None
    base = root.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@dataclass(frozen=True)
class FoundCallable:
    """Where a dotted target lives and its parameter list."""

    target: str
    path: Path
    lineno: int
    params: tuple[str, ...]
    owner: str | None  # class name for a method, None for a module-level function


def signature_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    """Parameter names as written: ``*args``/``**kw`` keep their stars and a bare ``*``
    marks the start of keyword-only parameters, so that a parameter moving across that
    boundary is a change too."""
    a = fn.args
    out = [p.arg for p in (*a.posonlyargs, *a.args)]
    if a.vararg is not None:
        out.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        out.append("*")
    out.extend(p.arg for p in a.kwonlyargs)
    if a.kwarg is not None:
        out.append("**" + a.kwarg.arg)
    return tuple(out)


def _split_target(root: Path, target: str) -> tuple[str, Path, list[str]]:
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        path = module_file(root, module)
        if path is not None:
            return module, path, parts[cut:]
    raise SourceLookupError(f"{target}: no module of it exists under {root}")


def _function_in(body: list[ast.stmt], name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    found = None
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            found = node  # the last definition wins, as at runtime
    return found


def _class_in(body: list[ast.stmt], name: str) -> ast.ClassDef | None:
    found = None
    for node in body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            found = node
    return found


def find_callable(root: Path, target: str) -> FoundCallable:
    """Locate ``module.function`` or ``module.Class.method`` (defined in that class body)."""
    return SourceTree(root).find_callable(target)


def _find_callable(src: SourceTree, target: str) -> FoundCallable:
    root = src.root
    _module, path, rest = _split_target(root, target)
    if len(rest) > 2:
        missing = ".".join(target.split(".")[:-2])
        raise SourceLookupError(f"{target}: no module {missing} under {root}")
    tree = src.parse(path)
    if len(rest) == 1:
        fn = _function_in(tree.body, rest[0])
        if fn is None:
            raise SourceLookupError(
                f"{target}: no function {rest[0]!r} in {path}{_near(tree.body, rest[0])}"
            )
        return FoundCallable(target, path, fn.lineno, signature_params(fn), None)
    if len(rest) == 2:
        cls = _class_in(tree.body, rest[0])
        if cls is None:
            raise SourceLookupError(f"{target}: no class {rest[0]!r} in {path}")
        fn = _function_in(cls.body, rest[1])
        if fn is None:
            raise SourceLookupError(
                f"{target}: class {rest[0]} in {path} does not define {rest[1]!r}"
                f"{_near(cls.body, rest[1])}"
            )
        return FoundCallable(target, path, fn.lineno, signature_params(fn), rest[0])
    raise SourceLookupError(f"{target}: expected module.function or module.Class.method")


def _near(body: list[ast.stmt], name: str) -> str:
    """``; did you mean 'x' (line N)?`` for functions of ``body`` named like ``name`` (a
    renamed method), else empty."""
    import difflib

    lines = {
        n.name: n.lineno for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    close = difflib.get_close_matches(name, list(lines), n=2, cutoff=0.75)
    if not close:
        return ""
    return "; did you mean " + " or ".join(f"{c!r} (line {lines[c]})" for c in close) + "?"


def base_names(cls: ast.ClassDef) -> list[str]:
    """Simple names of a class's bases (``a.B`` gives ``B``)."""
    out = []
    for b in cls.bases:
        if isinstance(b, ast.Name):
            out.append(b.id)
        elif isinstance(b, ast.Attribute):
            out.append(b.attr)
    return out


def iter_classes(root: Path, subdirs: tuple[str, ...]) -> list[tuple[Path, ast.ClassDef]]:
    """Every module-level class under ``root/<subdir>`` (recursively)."""
    return SourceTree(root).iter_classes(subdirs)


def _iter_classes(src: SourceTree, subdirs: tuple[str, ...]) -> list[tuple[Path, ast.ClassDef]]:
    out: list[tuple[Path, ast.ClassDef]] = []
    for sub in subdirs:
        for path in sorted((src.root / sub).rglob("*.py")):
            try:
                tree = src.parse(path)
            except SyntaxError:
                continue
            out.extend((path, n) for n in tree.body if isinstance(n, ast.ClassDef))
    return out


def class_attributes(root: Path, module: str, cls_name: str) -> set[str]:
    """Names a class defines: annotated fields, class-level assignments, methods, and
    ``self.<name> = ...`` assignments in its methods (its bases are not followed)."""
    return SourceTree(root).class_attributes(module, cls_name)


def _class_attributes(src: SourceTree, module: str, cls_name: str) -> set[str]:
    path = module_file(src.root, module)
    if path is None:
        raise SourceLookupError(f"no module {module} under {src.root}")
    cls = _class_in(src.parse(path).body, cls_name)
    if cls is None:
        raise SourceLookupError(f"no class {cls_name} in {path}")
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
    for sub in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(sub, ast.Assign):
            targets = list(sub.targets)
        elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)):
            targets = [sub.target]
        for t in targets:
            elts = t.elts if isinstance(t, ast.Tuple) else [t]
            for e in elts:
                if (
                    isinstance(e, ast.Attribute)
                    and isinstance(e.value, ast.Name)
                    and e.value.id == "self"
                ):
                    names.add(e.attr)
    return names


class SourceTree:
    """The source of one SGLang installation, each file parsed at most once per instance.

    The module-level functions of the same names build a fresh instance per call; keep one
    instance to look many things up (the contract tests do).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._trees: dict[Path, ast.Module] = {}

    def parse(self, path: Path) -> ast.Module:
        tree = self._trees.get(path)
        if tree is None:
            tree = self._trees[path] = parse_file(path)
        return tree

    def find_callable(self, target: str) -> FoundCallable:
        return _find_callable(self, target)

    def class_attributes(self, module: str, cls_name: str) -> set[str]:
        return _class_attributes(self, module, cls_name)

    def iter_classes(self, subdirs: tuple[str, ...]) -> list[tuple[Path, ast.ClassDef]]:
        return _iter_classes(self, subdirs)

    def module(self, module: str) -> ast.Module:
        path = module_file(self.root, module)
        if path is None:
            raise SourceLookupError(f"no module {module} under {self.root}")
        return self.parse(path)
