"""The conformance kit fails what training would fail on: four plugins, each with one bug a user shipped
(`library_desk.py`), fail by name with what to fix, while the same desk without the bug and the scaffold's
own plugin pass. One env_service serves all six, as a user's run.yaml would."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from env_service.conformance import run_conformance
from env_service.conformance.kit import fix_for
from tests.helpers import ServiceProcess, plugin_env_service

FAST = {"episodes": 2, "concurrency": 2, "max_steps": 6, "timeout_s": 20.0}
DESK = "tests.env_service.library_desk"
VARIANTS = {"library_desk": "LibraryDesk", "plain_text_crash": "PlainTextCrash", "set_info": "SetInfo",
            "dict_content": "DictContent", "set_state": "SetState"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    plugins = {name: f"{DESK}:{cls}" for name, cls in VARIANTS.items()}
    environments = {name: {} for name in [*VARIANTS, "shelves"]}
    with plugin_env_service(tmp_path_factory.mktemp("variants"), plugins, environments) as service:
        yield service


@pytest.mark.parametrize("env", ["library_desk", "shelves"])
async def test_the_desk_without_its_bugs_and_the_scaffolds_plugin_conform(server, env):
    report = await run_conformance(server.url, env, **FAST)
    assert report.ok, report.render()
    assert report.checks["environment_errors"].detail.startswith("none in ")
    assert report.checks["v1.state"].ok


@pytest.mark.parametrize(("env", "failed", "said"), [
    ("plain_text_crash", "environment_errors", "IndexError: list index out of range"),
    ("set_info", "environment_errors", "info.tools_used"),
    ("dict_content", "environment_errors", "ValidationError"),
    ("set_state", "v1.state", "answered HTTP 502"),
])
async def test_each_broken_variant_fails_by_name_with_what_to_fix(server, env, failed, said):
    report = await run_conformance(server.url, env, **FAST)
    assert not report.ok
    assert failed in report.failed, report.render()
    assert said in report.checks[failed].detail, report.render()
    rendered = report.render()
    assert f"FAIL {failed}" in rendered and "     fix: " in rendered
    assert report.checks[failed].fix() == fix_for(failed) != ""
    for check in report.checks.values():  # a check another stopped points there, not to its own fix
        if check.detail.startswith("stopped by "):
            assert check.fix().endswith("(above) first"), check
    assert "DOES NOT CONFORM" in rendered.splitlines()[-1]
