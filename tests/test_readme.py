"""The README is the door: under 400 lines, and what it says is what the code does. Its
flags and options table are checked against the options the plugin registers (read from
``pytest --help``, so a renamed, dropped or added option shows here whatever file
declares it), its links and example files against the tree."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FLAG = re.compile(r"--specperf-[a-z][a-z-]*[a-z]")
#: docs pages other issues create in parallel (#29 sglang, #31 faults); the lead drops a
#: name here when its page lands
PENDING_PAGES = {
    "docs/sglang.md",
    "docs/faults.md",
}


@cache
def _help() -> str:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def registered_flags() -> set[str]:
    """Every ``--specperf-*`` flag the plugin registers (pytest's own help lists them)."""
    return set(re.findall(r"^\s+(--specperf-[a-z-]+)", _help(), re.M))


def registered_ini() -> set[str]:
    """Live ini names: the old ones registered only to be refused ("refused: now ...") are left out."""
    lines = _help().splitlines()
    live = set()
    for i, line in enumerate(lines):
        m = re.match(r"^\s+(specperf_[a-z_]+) \(", line)
        if m and "refused: now" not in " ".join(lines[i : i + 2]):
            live.add(m.group(1))
    return live


def _table_rows() -> list[list[str]]:
    text = README.read_text()
    section = text.split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| option | ini |"), rows[0]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


def test_the_readme_is_a_door_not_a_notebook() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < 400, len(lines)
    head = "\n".join(lines[:60])
    # the status comes first: what has run where, and the script that shows the rest
    assert "not yet run on a GPU" in head and "scripts/gpu-check.sh" in head


def test_every_flag_the_readme_names_is_registered() -> None:
    named = set(FLAG.findall(README.read_text()))
    unknown = named - registered_flags()
    assert not unknown, f"the README names options the plugin does not register: {sorted(unknown)}"


def test_the_options_table_lists_every_registered_flag_and_ini_name() -> None:
    rows = _table_rows()
    in_table = {m for row in rows for m in FLAG.findall(row[0])}
    missing = registered_flags() - in_table
    assert not missing, f"registered but not in the README's options table: {sorted(missing)}"
    ini = {m for row in rows for m in re.findall(r"specperf_[a-z_]+", row[1])}
    assert ini <= registered_ini(), sorted(ini - registered_ini())
    assert not registered_ini() - ini, sorted(registered_ini() - ini)


def test_the_readme_links_and_files_exist() -> None:
    text = README.read_text()
    links = set(re.findall(r"\]\(((?:docs|examples|scripts)/[^)#\s]+)", text))
    links |= set(re.findall(r"`((?:examples|scripts)/[\w./-]+)`", text))
    assert links, "no links found"
    missing = {p for p in links if not (ROOT / p).exists()} - PENDING_PAGES
    assert not missing, sorted(missing)


def test_the_examples_in_the_readme_are_the_files_tests_run() -> None:
    text = README.read_text()
    for name in ("test_eagle3_own_server.py", "test_embedded_engine.py"):
        body = (ROOT / "examples" / name).read_text().rstrip()
        assert f"```python\n{body}\n```" in text, name
        assert len(body.splitlines()) <= 15, name


def test_every_docs_page_is_linked_from_the_readme() -> None:
    text = README.read_text()
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages and not {p for p in pages if f"]({p})" not in text}
