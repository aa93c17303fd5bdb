"""One llm_server process per model per test run, shared by every test that needs it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ServiceProcess, run_service


@pytest.fixture(scope="session")
def smollm2_server() -> Iterator[ServiceProcess]:
    # The first start on a fresh machine converts the GGUF once (~30 s); later starts take seconds.
    with run_service("llm_server", ["--model", "smollm2", "--max-batch", "8"], timeout=300) as server:
        yield server


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    # Settings from the run YAML's `llm_server` section, the model from a flag (flags win over the YAML).
    conf = Path(tmp_path_factory.mktemp("llm_server")) / "run.yaml"
    conf.write_text("llm_server:\n  model: smollm2\n  max_batch: 8\n  max_request_tokens: 256\n")
    with run_service("llm_server", ["--conf", str(conf), "--model", "tiny"], timeout=120) as server:
        yield server
