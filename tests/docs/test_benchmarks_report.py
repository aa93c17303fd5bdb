"""benchmarks/README.md is generated from the raw results: committed tables equal what the raw JSON gives."""

from __future__ import annotations

import json
import shutil

from benchmarks import report


def test_the_committed_report_is_what_the_raw_results_give():
    assert report.REPORT.read_text() == report.render(), (
        "benchmarks/README.md differs from its raw results: run .venv/bin/python -m benchmarks.report --write")


def test_a_changed_raw_number_changes_its_table(tmp_path, monkeypatch):
    results = tmp_path / "results"
    shutil.copytree(report.RESULTS, results, ignore=shutil.ignore_patterns("*.jsonl", "*.log", "*.txt"))
    for name in report.ENVIRONMENT_FILES:  # the environments table reads .jsonl too
        shutil.copy(report.RESULTS / name, results / name)
    chaos = json.loads((results / "chaos.json").read_text())
    chaos["kills"][0]["outage_s"] = 99.94
    (results / "chaos.json").write_text(json.dumps(chaos))
    monkeypatch.setattr(report, "RESULTS", results)
    text = report.render()
    assert "| env_service | 99.9 s | 2 |" in text
    assert text != report.REPORT.read_text()


def test_every_section_names_its_raw_files_and_command():
    text = report.render()
    sections = text.split("\n## ")[1:-1]  # the last one lists what is not covered yet
    assert len(sections) == len(report.SECTIONS)
    for body in sections:
        assert "](results/" in body, body.splitlines()[0]
        assert "```bash\n" in body, body.splitlines()[0]
        assert "\n| " in body, body.splitlines()[0]
