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

import httpx  # noqa: E402
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


@pytest.fixture(autouse=True)
def no_episode_left_open(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test must end every gateway episode it opens on the shared tiny server: one left open makes the next
    weight update there (in whichever test comes next on that worker) wait `gateway_drain_timeout_s`, 300 s."""
    server = request.getfixturevalue("tiny_server") if "tiny_server" in request.fixturenames else None
    yield
    if server is not None:
        left = httpx.get(f"{server.url}/v1/stats", timeout=30).json()["gateway"]["open_episodes"]
        if left:
            pytest.fail(f"{request.node.nodeid} left {left} gateway episode(s) open on tiny_server: end each "
                        "episode it opens (POST /v1/episodes/{id}/end)", pytrace=False)


# The test command runs two workers, one file each at a time (`-n 2 --dist loadfile`). Handing out the
# longest files first (measured on 2 cores) keeps both workers busy until the end instead of leaving
# one of them alone with a five-minute file. Files not listed follow in their usual order.
LONGEST_FILES_FIRST = (
    "tests/launcher/test_chaos.py",
    "tests/launcher/test_ablation.py",
    "tests/trainer/test_cli.py",
    "tests/trainer/test_learning.py",
    "tests/judge/test_judge_llm_server.py",
    "tests/task_manager/test_llm_pipeline.py",
    "tests/launcher/test_kill9.py",
    "tests/launcher/test_lifecycle.py",
    "tests/fuzz/test_openapi_fuzz.py",
    "tests/verl/test_plugin_loading.py",
    "tests/trainer/test_resilience.py",
    "tests/studio/test_browser.py",
    "tests/env_service/test_suites_http.py",
    "tests/experience_manager/test_crash.py",
    "tests/env_service/test_scaffold.py",
    "tests/trainer/test_environment_errors.py",
    "tests/launcher/test_collapse.py",
    "tests/docs/test_tutorial.py",
    "tests/launcher/test_preflight.py",
    "tests/task_manager/test_task_kinds.py",
    "tests/trainer/test_collapse.py",
    "tests/trainer/test_mechanisms.py",
    "tests/task_manager/test_hindsight_flights.py",
    "tests/env_service/test_textgames.py",
    "tests/trainer/test_evaluate.py",
    "tests/verl/test_parity.py",
    "tests/task_manager/test_leak_canary.py",
    "tests/llm_server/test_structured_smollm2.py",
)


def pytest_configure(config: pytest.Config) -> None:
    # xdist otherwise reorders files by their number of tests, which undoes the order below.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: in-file order kept
