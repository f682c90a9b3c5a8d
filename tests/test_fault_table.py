"""docs/faults.md's table is generated from the fault suite: it must name every fault
test, and only fault tests (regenerate it with ``--fault-table=docs/faults.md``)."""

from __future__ import annotations

from pathlib import Path

import fault_table

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "faults.md"


def test_every_fault_test_has_a_row_and_every_row_a_fault_test() -> None:
    tests = fault_table.fault_tests(ROOT / "tests")
    named = fault_table.documented(PAGE)
    assert tests, "no fault tests found"
    assert not tests - named, (
        f"fault tests without a row in {PAGE} (regenerate it): {sorted(tests - named)}"
    )
    assert not named - tests, f"rows of tests that are gone: {sorted(named - tests)}"


def test_the_table_is_written_between_its_markers(tmp_path, monkeypatch) -> None:
    page = tmp_path / "faults.md"
    page.write_text(f"# t\n\nbefore\n{fault_table.START}\nold row\n{fault_table.END}\nafter\n")
    monkeypatch.setattr(fault_table, "ROWS", {})
    fault_table.row("a | b", 2, "ok", True, by="tests/test_x.py::test_a")
    fault_table.row("c", 1, "lost one", False, by="tests/test_x.py::test_c")
    fault_table.write(page)
    text = page.read_text()
    assert "old row" not in text and text.startswith("# t\n\nbefore\n") and text.endswith("after\n")
    assert (
        "| a / b | 2 | ok | yes | `test_a` |" in text
        and "| c | 1 | lost one | NO | `test_c` |" in text
    )
    assert fault_table.documented(page) == {"test_a", "test_c"}
    # a partial run replaces its own rows and keeps the others, dropping gone tests'
    monkeypatch.setattr(fault_table, "ROWS", {})
    fault_table.row("c again", 3, "all kept", True, by="tests/test_x.py::test_c")
    fault_table.row("new", 1, "ok", True, by="tests/test_x.py::test_d")
    fault_table.write(page, keep={"test_a", "test_c", "test_d"})
    rows = [ln for ln in page.read_text().splitlines() if ln.startswith("| ") and "`" in ln]
    assert [r.split(" | ")[0] for r in rows] == ["| a / b", "| c again", "| new"]
    fault_table.write(page, keep={"test_c", "test_d"})
    assert fault_table.documented(page) == {"test_c", "test_d"}
