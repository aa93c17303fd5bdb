"""The conformance kit: it passes against our server for every built-in environment, and it detects
(and names) each fault of deliberately broken servers."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from env_service.conformance import run_conformance
from tests.helpers import REPO, ServiceProcess, free_port, run_service

BUILT_IN = ("flights", "gym", "bfcl", "signal")
FAST = {"episodes": 3, "concurrency": 4, "max_steps": 12, "timeout_s": 20.0}


@pytest.fixture(scope="module")
def our_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    conf = tmp_path_factory.mktemp("conformance") / "env.yaml"
    conf.write_text("env_service:\n  environments:\n" + "".join(f"    {name}: {{}}\n" for name in BUILT_IN))
    with run_service("env_service", ["--conf", str(conf)]) as service:
        yield service


@pytest.mark.parametrize("env", BUILT_IN)
async def test_our_server_conforms_for_every_built_in_environment(our_server, env):
    report = await run_conformance(our_server.url, env, **FAST)
    assert report.ok, report.render()
    # Both APIs were checked, and the leak check had an instance listing to compare.
    assert {"v1.step_shape", "ae.step_shape", "episodes", "concurrency"} <= set(report.checks)
    assert "live 0 -> 0" in report.checks["leak"].detail
    forks = env in ("flights", "signal")  # the environments that declare the fork capability
    assert report.checks["v1.fork"].detail == ("a fork is an independent copy" if forks else "not declared")


@pytest.mark.parametrize("protocol", ["v1", "agentevolver"])
async def test_remote_environment_conforms_forwarding_either_protocol(our_server, tmp_path, protocol):
    conf = tmp_path / "remote.yaml"
    conf.write_text("env_service:\n  environments:\n    remote:\n"
                    f"      url: {our_server.url}\n      protocol: {protocol}\n      env_type: flights\n")
    with run_service("env_service", ["--conf", str(conf)]) as front:
        report = await run_conformance(front.url, "remote", **FAST)
    assert report.ok, report.render()


@pytest.fixture
def faulty_server(request: pytest.FixtureRequest) -> Iterator[ServiceProcess]:
    with run_service("tests.env_service.conformance_faulty_server", ["--fault", request.param, "--hang-s", "4"]) as s:
        yield s


@pytest.mark.parametrize("faulty_server", ["none"], indirect=True)
async def test_the_fault_free_fake_conforms(faulty_server):
    """The baseline: the broken servers below differ from this one by exactly their fault."""
    report = await run_conformance(faulty_server.url, "counter", **FAST)
    assert report.ok, report.render()
    assert report.checks["apis"].detail == "offered: ae"


@pytest.mark.parametrize(("faulty_server", "named"), [
    ("wrong_shape", "ae.step_shape"),
    ("leak", "leak"),
    ("no_404", "ae.unknown_instance"),
    ("eval_range", "ae.evaluate_range"),
    ("no_query", "ae.synthetic_query"),
], indirect=["faulty_server"])
async def test_each_fault_is_detected_and_named(faulty_server, named):
    report = await run_conformance(faulty_server.url, "counter", **FAST)
    assert not report.ok
    assert named in report.failed, report.render()
    assert f"FAIL {named}" in report.render()


@pytest.mark.parametrize("faulty_server", ["hang"], indirect=True)
def test_cli_names_a_hanging_step_and_exits_nonzero(faulty_server):
    done = subprocess.run([sys.executable, "-m", "env_service.conformance", "--url", faulty_server.url,
                           "--env", "counter", "--episodes", "1", "--concurrency", "2", "--timeout", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL timeouts" in done.stdout and "step" in done.stdout
    assert "DOES NOT CONFORM" in done.stdout


def test_cli_exits_zero_with_a_short_report_when_the_server_conforms(our_server):
    done = subprocess.run([sys.executable, "-m", "env_service.conformance", "--url", our_server.url,
                           "--env", "gym", "--episodes", "2", "--concurrency", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("CONFORMS") and "FAIL" not in done.stdout


async def test_an_unreachable_server_fails_healthz_and_apis():
    report = await run_conformance(f"http://127.0.0.1:{free_port()}", "bfcl", **FAST)
    assert not report.ok and {"healthz", "apis"} <= set(report.failed)
