"""The five services, each a real process on a free port, shared by the fuzzing and regression tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers import ServiceProcess, run_service
from tests.judge.fake_judge_llm import fake_judge_llm


def _conf(directory: Path, data: dict) -> str:
    path = directory / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(scope="package")
def env_service(tmp_path_factory) -> Iterator[ServiceProcess]:
    conf = _conf(tmp_path_factory.mktemp("fuzz-env"), {"env_service": {"max_instances": 64, "environments": {
        "flights": {"splits": {"train": 8, "validation": 2, "test": 2}},
        "gym": {"envs": ["FrozenLake-v1"], "splits": {"train": 2, "validation": 1, "test": 1}},
        "signal": {}}}})
    with run_service("env_service", ["--conf", conf, "--log-level", "WARNING"]) as service:
        yield service


@pytest.fixture(scope="package")
def experience_manager(tmp_path_factory) -> Iterator[ServiceProcess]:
    root = tmp_path_factory.mktemp("fuzz-em")
    with run_service("experience_manager", ["--store", str(root / "store"), "--log-level", "WARNING"]) as service:
        yield service


@pytest.fixture(scope="package")
def task_manager(env_service, tmp_path_factory) -> Iterator[ServiceProcess]:
    root = tmp_path_factory.mktemp("fuzz-tm")
    conf = _conf(root, {"task_manager": {"env_url": env_service.url, "store_dir": str(root / "store"),
                                         "environments": ["flights"]}})
    with run_service("task_manager", ["--conf", conf, "--log-level", "WARNING"]) as service:
        yield service


@pytest.fixture(scope="package")
def judge(tmp_path_factory) -> Iterator[ServiceProcess]:
    work = tmp_path_factory.mktemp("fuzz-judge")
    with fake_judge_llm() as (url, _calls):
        conf = work / "run.yaml"
        conf.write_text(json.dumps({"judge": {"llm": {"base_url": url, "model": "fake-judge", "max_retries": 0,
                                                      "timeout": 20}, "audit_log": str(work / "audit.jsonl")}}))
        with run_service("judge", ["--conf", str(conf), "--log-level", "WARNING"], timeout=60) as service:
            yield service


@pytest.fixture(scope="package")
def llm_server(tmp_path_factory) -> Iterator[ServiceProcess]:
    work = tmp_path_factory.mktemp("fuzz-llm")
    conf = _conf(work, {"llm_server": {"model": "tiny", "max_batch": 8, "max_request_tokens": 64,
                                       "default_max_tokens": 8, "weights_dir": str(work),
                                       "grammar_timeout_s": 2.0}})
    with run_service("llm_server", ["--conf", conf, "--log-level", "WARNING"], timeout=120) as service:
        yield service
