"""``benchmarks/docs_tables.py``: every table of figures in README.md and docs/ is what the script
writes from the committed results files, so the docs cannot drift from the measurements."""

from __future__ import annotations

import pytest

from benchmarks import docs_tables


def test_docs_hold_the_tables_their_results_files_give(capsys):
    code = docs_tables.main(["--check"])
    assert code == 0, capsys.readouterr().err


def test_every_table_is_in_a_doc():
    used = {r.name for r in docs_tables.regions()}
    assert used == set(docs_tables.TABLES)


def test_a_stale_region_is_rewritten_and_check_names_it(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "README.md"
    doc.write_text("# t\n\n<!-- docs_tables: moe-layer-memory -->\n| old | table |\n<!-- /docs_tables -->\n\nafter\n")
    monkeypatch.setattr(docs_tables, "ROOT", tmp_path)
    assert docs_tables.main(["--check"]) == 1
    assert "README.md: table 'moe-layer-memory' differs" in capsys.readouterr().err
    assert docs_tables.main([]) == 0
    text = doc.read_text()
    assert "| old | table |" not in text and text.endswith("<!-- /docs_tables -->\n\nafter\n")
    assert "| Qwen3-30B-A3B (E=128, k=8), T=32768 | 2.89 |" in text
    assert "From `benchmarks/results/moe_layer-h200-2026-11-29.json` (`python -m benchmarks.moe_layer" in text
    assert docs_tables.main(["--check"]) == 0


def test_an_unknown_table_name_is_refused(tmp_path, monkeypatch):
    (tmp_path / "README.md").write_text("<!-- docs_tables: no-such-table -->\n<!-- /docs_tables -->\n")
    monkeypatch.setattr(docs_tables, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match="no table named 'no-such-table'"):
        docs_tables.regions()


def test_peaks_come_only_from_files_that_count_them_the_docs_way(monkeypatch):
    # The moe_layer file predates the "peak" key; without its listed exception it is refused.
    monkeypatch.setattr(docs_tables, "COUNTED_SO", set())
    with pytest.raises(SystemExit, match="does not count peak memory"):
        docs_tables.moe_layer_memory()
    # The harness file counts peaks another way: no table shows its peak columns.
    harness = docs_tables.load(docs_tables.HARNESSES_FILE)
    assert not docs_tables.counts_peaks_so(docs_tables.HARNESSES_FILE, harness)
    assert "peak" not in "\n".join(docs_tables.dense_stack()).lower()
