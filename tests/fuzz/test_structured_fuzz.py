"""llm_server's structured-output fields, fuzzed with shapes close to valid (Hypothesis, over a real socket).

The OpenAPI document types `response_format` and `structured_outputs` as free JSON, so the schema
fuzzer rarely builds a constraint that reaches the grammar compiler. Here the generated values are
almost-right constraints: JSON schemas, regexes, choices and Lark grammars with random parts. Any
answer is fine except a server error: 200 with choices, or a 4xx naming what is wrong.
"""

from __future__ import annotations

import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow

TYPES = st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "array", "strin", 5])
SCHEMAS = st.recursive(
    st.fixed_dictionaries({"type": TYPES}, optional={"enum": st.lists(st.integers(-3, 3) | st.text(max_size=3),
                                                                      max_size=3),
                                                     "minLength": st.integers(-1, 3),
                                                     "pattern": st.text("ab()|*+?[]^$\\.", max_size=6)}),
    lambda inner: st.fixed_dictionaries(
        {"type": st.just("object")},
        optional={"properties": st.dictionaries(st.text("abc", min_size=1, max_size=3), inner, max_size=3),
                  "required": st.lists(st.text("abc", min_size=1, max_size=3), max_size=3),
                  "additionalProperties": st.booleans()})
    | st.fixed_dictionaries({"type": st.just("array"), "items": inner}, optional={"maxItems": st.integers(0, 3)})
    | st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)}),
    max_leaves=6,
)
REGEXES = st.text("ab01()|*+?{},[]^$\\.", max_size=10)
GRAMMARS = st.builds(lambda rule, body: f"start: {rule}\n{rule}: {body}\n",
                     st.sampled_from(["x", "word", "start"]), st.text('"ab| ()*+?xy', max_size=12))
CONSTRAINTS = st.one_of(
    st.builds(lambda s: {"response_format": {"type": "json_schema", "json_schema": {"name": "fz", "schema": s}}},
              SCHEMAS),
    st.just({"response_format": {"type": "json_object"}}),
    st.builds(lambda s: {"structured_outputs": {"json": s}}, SCHEMAS | SCHEMAS.map(json.dumps)),
    st.builds(lambda r: {"structured_outputs": {"regex": r}}, REGEXES),
    st.builds(lambda c: {"structured_outputs": {"choice": c}}, st.lists(st.text(max_size=4), max_size=4)),
    st.builds(lambda g: {"structured_outputs": {"grammar": g}}, GRAMMARS),
    st.builds(lambda r: {"guided_regex": r}, REGEXES),
    st.builds(lambda c: {"guided_choice": c}, st.lists(st.text(max_size=4), min_size=1, max_size=3)),
)


@settings(max_examples=int(os.environ.get("EVOLVER_FUZZ_EXAMPLES", "12")) * 3, deadline=None, database=None,
          derandomize=True, suppress_health_check=list(HealthCheck))
@given(constraint=CONSTRAINTS, chat=st.booleans())
def test_structured_output_constraints_never_get_a_server_error(llm_server, constraint, chat):
    body = {"model": "tiny", "max_tokens": 4, "temperature": 0, **constraint}
    if chat:
        route, body = "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "go"}]}
    else:
        route, body = "/v1/completions", {**body, "prompt": "go"}
    response = httpx.post(f"{llm_server.url}{route}", json=body, timeout=60)
    assert response.status_code < 500, (constraint, response.text)
    answer = response.json()
    if response.status_code == 200:
        assert len(answer["choices"]) == 1
    else:
        assert response.status_code in (400, 422) and answer["error"]["message"], answer
