"""The documentation: the site builds strictly, README links resolve, the configuration reference is current."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from evolver_launcher import config_reference
from task_manager import profile_reference
from task_manager.profile import Lookup

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
# [text](target) and ![alt](target); the target ends at whitespace or ')'.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(markdown: str) -> list[str]:
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)  # code blocks hold no links
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:|#", target)]


def test_relative_links_finds_links_and_skips_urls_and_code():
    sample = "[a](docs/x.md) ![p](img.png) [u](https://x.org) [h](#top)\n```\n[c](nothere.md)\n```\n[b](y.md#part)"
    assert relative_links(sample) == ["docs/x.md", "img.png", "y.md#part"]


def test_every_relative_link_in_the_readme_resolves():
    links = relative_links(README.read_text())
    assert len(links) > 20
    missing = [link for link in links if not (REPO / link.split("#", 1)[0]).exists()]
    assert missing == [], f"README.md links to missing files: {missing}"


def test_every_relative_link_in_the_benchmarks_report_and_changelog_resolves():
    for page in (REPO / "benchmarks" / "README.md", REPO / "CHANGELOG.md"):
        missing = [link for link in relative_links(page.read_text())
                   if not (page.parent / link.split("#", 1)[0]).exists()]
        assert missing == [], f"{page.relative_to(REPO)} links to missing files: {missing}"


def test_readme_is_short_and_keeps_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    assert "bash install.sh && .venv/bin/python launcher.py --conf examples/quickstart.yaml" in text
    after_marker = text.split("<!-- test-command -->", 1)[1]
    assert re.search(r"^bash install.sh && .*pytest", after_marker, flags=re.M), "the test command follows the marker"
    assert not re.search(r"\b[0-9a-f]{7,40}\b", text.replace("sha256", "")), "no commit hashes in README.md"


def test_configuration_reference_is_what_its_generator_prints():
    committed = config_reference.PAGE.read_text()
    assert committed == config_reference.render(), (
        "docs/configuration-reference.md is stale: run .venv/bin/python -m evolver_launcher.config_reference --write")


def test_profile_reference_is_what_its_generator_prints():
    assert profile_reference.PAGE.read_text() == profile_reference.render(), (
        "docs/profile-reference.md is stale: run .venv/bin/python -m task_manager.profile_reference --write")
    # The lookup section documents every field of the model that reads it.
    page = profile_reference.render()
    section = page.split("## `profile.entities[].opts[].lookups[]`\n", 1)[1].split("\n## ", 1)[0]
    for name in Lookup.model_fields:
        assert f"| `{name}` |" in section, name


def test_configuration_reference_names_every_section_and_key_descriptions():
    page = config_reference.render()
    for section in ("launcher", "launcher.restart", "llm_server", "env_service", "task_manager",
                    "experience_manager", "judge", "trainer", "trainer.rollout", "trainer.optim", "trainer.eval"):
        assert f"## `{section}`\n" in page
    # A description from Field(description=...) and one from a trailing comment in the class body.
    assert ("| `max_restarts` | int | `2` | restarts per child within window_s; one more crash inside the window "
            "stops the run |") in page
    assert "| `actors` | int | `2` | the fixed pool; each hosts many instances |" in page


def test_the_site_builds_in_strict_mode(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "own-environment" / "index.html").exists()


def test_example_headers_are_at_most_15_lines():
    frozen = REPO / "examples" / "ablation" / "flights.yaml"  # its sha256 is recorded in every v1 result
    long_headers = {}
    for path in sorted((REPO / "examples").rglob("*.yaml")):
        lines = path.read_text().splitlines()
        header = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
        if header > 15 and path != frozen:
            long_headers[str(path.relative_to(REPO))] = header
    assert long_headers == {}, "YAML headers say what the config does, how to run it and what to expect"
