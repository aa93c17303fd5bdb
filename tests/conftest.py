import os

# Tests never reach a hub, and keep the two cores for the processes under test.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# OpenMP busy-waiting makes torch threads of different processes starve each other on 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.pop("EVOLVER_API_TOKEN", None)


from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.helpers import ServiceProcess, run_service  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_server() -> Iterator[ServiceProcess]:
    """One SmolLM2 llm_server per test run, shared by every area that needs a real model."""
    # The first start on a fresh machine converts the GGUF once (~30 s); later starts take seconds.
    # float32, not the server's bf16 default: tests compare token paths exactly (greedy from a prompt that
    # holds generated tokens equals the decoded continuation), which bf16 near-ties break.
    with run_service("llm_server", ["--model", "smollm2", "--max-batch", "8", "--dtype", "float32"],
                     timeout=300) as server:
        yield server


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    # Settings from the run YAML's `llm_server` section, the model from a flag (flags win over the YAML).
    conf = Path(tmp_path_factory.mktemp("llm_server")) / "run.yaml"
    # Weights load only from inside weights_dir: every test's tmp_path lies under the base temp dir.
    conf.write_text("llm_server:\n  model: smollm2\n  max_batch: 8\n  max_request_tokens: 256\n"
                    f"  weights_dir: {tmp_path_factory.getbasetemp()}\n")
    with run_service("llm_server", ["--conf", str(conf), "--model", "tiny"], timeout=120) as server:
        yield server
