"""One llm_server process per model per test run, shared by every test that needs it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import ServiceProcess, run_service


@pytest.fixture(scope="session")
def smollm2_server() -> Iterator[ServiceProcess]:
    # The first start on a fresh machine converts the GGUF once (~30 s); later starts take seconds.
    with run_service("llm_server", ["--model", "smollm2", "--max-batch", "8"], timeout=300) as server:
        yield server


@pytest.fixture(scope="session")
def tiny_server() -> Iterator[ServiceProcess]:
    with run_service("llm_server", ["--model", "tiny", "--max-batch", "8", "--max-request-tokens", "256"],
                     timeout=120) as server:
        yield server
