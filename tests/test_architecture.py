"""The wings hold: what each part of the package may import, read from the source by ``ast``.

- Only ``plugin/`` imports pytest and pytest-benchmark (the pytest11 entry point is
  ``pytest_specperf.plugin``).
- ``judging/`` is pure: no pytest, no HTTP or socket library, no torch, no server code,
  no files, locks or clocks (os, yaml, filelock, time, datetime), no store.
- No folder import cycle: the folder graph (an arrow for every import of one package folder
  by another, at run time, inside functions or under ``TYPE_CHECKING``) has no loop.
- ``telemetry/`` samples only: it imports nothing of the package outside itself (no
  verdict rule, no phase vocabulary).
- Only ``cli/`` parses a command line with argparse (the reference engine's server process
  reads its own argv: it is launched by the backend, not a command of ``specperf``).
- ``server/protocol.py`` imports no backend implementation (the registry picks them).
- ``run/`` is the pipeline without pytest: it imports no pytest and nothing of ``plugin/``
  or ``cli/``. ``server/`` imports nothing above it (no verdict rule, no pipeline, no
  glue): measuring never calls back up into judging. No module cycle in ``plugin/`` or
  ``run/`` (``plugin/cases`` and ``plugin/fixtures`` once imported each other).
- The store parses its own files: the baseline validator lives in ``store/``, judging
  defines no file parser (no ``parse_*`` but the parsers of a value a person types, no
  validator error, no ``*_schema`` module), and what store imports from judging is records
  and rules only, never a parser.
- The end of the run (``run/finish.py``) writes the baselines and reports without pytest.
- No function is longer than 60 lines, except the ones the README's architecture note
  names with their reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_specperf"
MAX_FUNCTION_LINES = 60
#: Functions allowed over the limit, with the reason (the README repeats them).
LONG_FUNCTION_EXCEPTIONS: dict[str, str] = {}


def _modules(sub: str = "") -> list[Path]:
    return sorted((PACKAGE / sub).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every module name imported anywhere in ``path`` (top level or inside functions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _offenders(paths: list[Path], banned: tuple[str, ...]) -> list[str]:
    bad = []
    for path in paths:
        for name in _imports(path):
            if any(name == b or name.startswith(b + ".") for b in banned):
                bad.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    return bad


def test_only_the_plugin_wing_imports_pytest() -> None:
    outside = [p for p in _modules() if "plugin" not in p.relative_to(PACKAGE).parts]
    assert _offenders(outside, ("pytest", "_pytest", "pytest_benchmark")) == []


def test_the_plugin_wing_is_the_entry_point() -> None:
    import tomllib

    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["pytest11"] == {
        "specperf": "pytest_specperf.plugin"
    }


def test_every_hook_of_the_plugin_wing_reaches_pytest() -> None:
    """pytest calls only the hooks it finds on the entry point's module: a hook defined in
    ``plugin.hooks`` and not imported there is never called (``pytest_collection_finish``
    was not, until 2026-12-05, and every run judged its cases at one test's share)."""
    import ast

    import pytest_specperf.plugin as wing

    tree = ast.parse((PACKAGE / "plugin" / "hooks.py").read_text())
    hooks = [n.name for n in tree.body
             if isinstance(n, ast.FunctionDef) and n.name.startswith("pytest_")]  # fmt: skip
    assert "pytest_collection_finish" in hooks
    assert [h for h in hooks if not hasattr(wing, h)] == []


@pytest.mark.parametrize(
    "banned",
    [
        ("pytest", "_pytest"),
        ("torch", "pynvml", "sglang"),
        ("http", "urllib", "socket", "requests", "httpx"),
        ("pytest_specperf.server", "pytest_specperf.plugin", "pytest_specperf.engines"),
        ("os", "yaml", "filelock", "time", "datetime"),
        ("pytest_specperf.store", "pytest_specperf.cli"),
    ],
)
def test_judging_is_pure(banned: tuple[str, ...]) -> None:
    assert _offenders(_modules("judging"), banned) == []


#: judging's ``parse_*`` functions: each parses a value a person types (an option, a marker
#: keyword, a calibration argument), never a stored file.
JUDGING_VALUE_PARSERS = {"parse_budget", "parse_costs", "parse_fraction"}


def _defined(path: Path) -> set[str]:
    """The names of the functions and classes ``path`` defines (at any depth)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}  # fmt: skip


def _imported_names(path: Path, prefix: str) -> set[str]:
    """``module.name`` of every name ``path`` imports from a module under ``prefix``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(prefix):
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_the_store_parses_its_own_files() -> None:
    """No parse climb between store/ and judging/: the baseline file's validator is in
    store/, judging holds records and rules only."""
    judging = _modules("judging")
    assert [p.name for p in judging if p.stem.endswith("_schema")] == []
    parsers = [f"{p.name}:{name}" for p in judging for name in _defined(p)
               if (name.startswith("parse_") and name not in JUDGING_VALUE_PARSERS)
               or name == "Invalid"]  # fmt: skip
    assert parsers == []
    assert (PACKAGE / "store" / "baseline_schema.py").is_file()
    climbs = [f"{p.relative_to(PACKAGE.parent)} imports {name}" for p in _modules("store")
              for name in _imported_names(p, f"{PACKAGE.name}.judging")
              if name.rsplit(".", 1)[1].startswith(("parse", "check_", "Invalid"))]  # fmt: skip
    assert climbs == []


def test_the_end_of_the_run_has_no_pytest() -> None:
    assert (PACKAGE / "run" / "finish.py").is_file()
    assert not (PACKAGE / "plugin" / "finish.py").exists()


def test_reporting_does_not_talk_to_servers_or_pytest() -> None:
    banned = ("pytest", "_pytest", "pytest_benchmark", "torch", "pytest_specperf.server",
              "pytest_specperf.plugin")  # fmt: skip
    assert _offenders(_modules("reporting"), banned) == []


def _folder(module: str) -> str | None:
    """The package folder that ``module`` lies in; a top-level module is a node of its own
    (``__init__`` for the package itself, which every folder may use)."""
    parts = module.split(".")
    if parts[0] != PACKAGE.name:
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def folder_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Folder -> the folders its modules import (every import in the file, so run-time,
    function-level and ``TYPE_CHECKING`` ones alike)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).parts
        src = rel[0] if len(rel) > 1 else path.stem
        for name in _imports(path):
            dst = _folder(name)
            if dst is not None and dst != src:
                graph.setdefault(src, set()).add(dst)
    return graph


def folder_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each loop of ``graph`` once, as the folders in order (depth-first search)."""
    cycles: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                loop = path[path.index(nxt) :]
                if frozenset(loop) not in seen:
                    seen.add(frozenset(loop))
                    cycles.append([*loop, nxt])
            elif len(path) < len(graph) + 1:
                visit(nxt, [*path, nxt])

    for start in sorted(graph):
        visit(start, [start])
    return cycles


def test_folder_cycles_are_found() -> None:
    """The cycle finder itself, on small named graphs."""
    assert folder_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert folder_cycles({"engines": {"server"}, "server": {"engines"}}) == [
        ["engines", "server", "engines"]
    ]


def test_no_folder_import_cycle() -> None:
    assert folder_cycles(folder_graph()) == []


def test_telemetry_samples_only() -> None:
    """Verdict rules (bottleneck, gates) live in judging/: telemetry imports nothing of the
    package outside itself, neither judging nor the phase vocabulary a rule is written in."""
    others = tuple(
        f"{PACKAGE.name}.{p.name}"
        for p in PACKAGE.iterdir()
        if p.is_dir() and p.name != "telemetry"
    )
    assert _offenders(_modules("telemetry"), others) == []


#: A process's own argv, not a ``specperf`` command: launched by the reference backend.
ARGPARSE_ELSEWHERE = {"pytest_specperf/engines/reference/server.py"}


def test_only_cli_parses_a_command_line() -> None:
    outside = [
        p
        for p in _modules()
        if p.relative_to(PACKAGE).parts[0] != "cli"
        and str(p.relative_to(PACKAGE.parent)) not in ARGPARSE_ELSEWHERE
    ]
    assert _offenders(outside, ("argparse",)) == []


def test_the_backend_protocol_imports_no_implementation() -> None:
    protocol = PACKAGE / "server" / "protocol.py"
    assert _offenders([protocol], ("pytest_specperf.engines.reference",
                                   "pytest_specperf.engines.sglang")) == []  # fmt: skip


def test_the_run_pipeline_has_no_pytest() -> None:
    run = _modules("run")
    assert [p.name for p in run if p.name != "__init__.py"], "run/ holds the pipeline"
    banned = ("pytest", "_pytest", "pytest_benchmark", "pytest_specperf.plugin",
              "pytest_specperf.cli")  # fmt: skip
    assert _offenders(run, banned) == []


def test_the_server_imports_nothing_above_it() -> None:
    above = tuple(f"{PACKAGE.name}.{f}" for f in
                  ("judging", "run", "plugin", "store", "reporting", "cli", "engines"))  # fmt: skip
    assert _offenders(_modules("server"), above) == []


def module_graph(folder: str) -> dict[str, set[str]]:
    """Module -> the modules of the same folder it imports (``__init__`` left out: a
    package's face)."""
    mods = {
        f"{PACKAGE.name}.{folder}.{p.stem}": p
        for p in _modules(folder)
        if p.name != "__init__.py" and p.parent == PACKAGE / folder
    }
    return {name: {m for m in _imports(path) if m in mods and m != name}
            for name, path in mods.items()}  # fmt: skip


@pytest.mark.parametrize("folder", ["plugin", "run"])
def test_no_module_cycle_in_the_run_or_its_glue(folder: str) -> None:
    assert folder_cycles(module_graph(folder)) == []


def test_no_function_over_the_limit() -> None:
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                where = f"{path.relative_to(PACKAGE.parent)}:{node.name}"
                if lines > MAX_FUNCTION_LINES and where not in LONG_FUNCTION_EXCEPTIONS:
                    long.append(f"{where} ({lines} lines)")
    assert long == []


def _metric_literals(path: Path, names: set[str]) -> list[str]:
    """Where ``path`` spells a metric name: a literal of an unambiguous name (outside list
    literals such as table headers), and ``"step"`` where it is used as a key
    (``x["step"]``, ``x.get("step")``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    in_lists = {
        id(e) for n in ast.walk(tree) if isinstance(n, (ast.List, ast.Tuple)) for e in n.elts
    }
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in in_lists:
            key = node
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice if node.slice.value == "step" else None
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "step"
        ):
            key = node.args[0]
        if key is not None:
            found.append(f"{path.relative_to(PACKAGE.parent)}:{key.lineno} {key.value!r}")
    return found


def test_metric_names_come_from_the_registry() -> None:
    """No module but the registry (and the phase vocabulary) spells a metric name."""
    from pytest_specperf.judging.metrics import REGISTRY, STEP, STEP_PER_REF

    names = (set(REGISTRY) - {STEP}) | {STEP_PER_REF}
    found = []
    for path in _modules():
        parts = path.relative_to(PACKAGE).parts
        if path == PACKAGE / "judging" / "metrics.py" or parts[0] in ("engines", "probe"):
            continue  # the probe defines the phase vocabulary and the record format; the
            # engines speak their servers' vocabularies

        found += _metric_literals(path, names)
    assert found == []


def test_a_record_column_is_built_from_its_registry_entry_alone() -> None:
    """A metric read straight from a step record (``metrics.RECORD_COLUMNS``) has its
    sample in its registry entry: the samples and the store neither name it nor read its
    record field, so a new probe field is its measurement (``probe/``) and its entry
    (words about it, ``judging/diagnosis.py`` and ``bottleneck.py``, may read its summary)."""
    from pytest_specperf.judging import metrics

    columns = {name for name, _ in metrics.RECORD_COLUMNS}
    constants = {k for k, v in vars(metrics).items() if isinstance(v, str) and v in columns}
    assert columns >= {metrics.RUNQ_SHARE, metrics.RUNQ_SLICES}
    fields = {"step_runq_ns", "step_slices"}  # the fields those entries read
    found = []
    for path in [PACKAGE / "judging" / "samples.py", *_modules("store")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == metrics.__name__:
                found += [f"{path.name}: {a.name}" for a in node.names if a.name in constants]
            if isinstance(node, ast.Attribute) and node.attr in fields:
                found += [f"{path.name}:{node.lineno} .{node.attr}"]
    assert found == []


def test_one_case_record_from_the_judge_to_every_output() -> None:
    """A judged case is written by one function (``store.report.case_json``), called only
    by its record (``CaseRecord.of``): no other module builds a case's written form."""
    found = []
    for path in _modules():
        if path == PACKAGE / "store" / "report.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "pytest_specperf.store.report":
                found += [f"{path.name}: {a.name}" for a in node.names if a.name == "case_json"]
    assert found == []
    source = (PACKAGE / "store" / "report.py").read_text()
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "case_json"
    ]
    assert len(calls) == 1  # in CaseRecord.of
