"""Schema-driven fuzzing of every service through its own OpenAPI document (Schemathesis, real processes).

Each operation gets generated valid and invalid requests over real sockets. Checks: no 5xx, the status
code, content type, headers and body each as the document says, and schema-invalid requests refused
with a 4xx. Not checked: `positive_data_acceptance`: 31 operations (measured with 12 examples each)
still answer 400/422 to some schema-valid requests, for constraints their documents do not state
(id patterns, fields optional in the model but required by the route, semantic checks); and
`allow_header_conformance` (Starlette lists only the first matching route's methods in a 405's
Allow header).
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers import ServiceProcess

pytestmark = pytest.mark.slow

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance, negative_data_rejection]
# About 3 CI minutes for the five services together (~70 operations); raise it for a deeper local run.
FUZZ = settings(max_examples=int(os.environ.get("EVOLVER_FUZZ_EXAMPLES", "10")), deadline=None, derandomize=True, database=None,
                phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))


def fuzz(service: ServiceProcess) -> None:
    """Every operation, valid then invalid requests; all failures reported together."""
    schema = schemathesis.openapi.from_url(f"{service.url}/openapi.json")
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @FUZZ
            def run(case) -> None:
                case.call_and_validate(checks=CHECKS, timeout=60)

            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (no parameters, or only free-form strings)
                continue
            except BaseException as exc:  # collect: one service's report names every broken operation
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):  # Schemathesis' FailureGroup is no Exception
                    raise
                failures.append(f"{operation.label} ({mode.value}): {exc}"[:3000])
    assert operations > 0
    assert not failures, f"{len(failures)} failing operation(s):\n\n" + "\n\n".join(failures)


def test_env_service(env_service):
    fuzz(env_service)


def test_experience_manager(experience_manager):
    fuzz(experience_manager)


def test_task_manager(task_manager):
    fuzz(task_manager)


def test_judge(judge):
    fuzz(judge)


def test_llm_server(llm_server):
    fuzz(llm_server)
