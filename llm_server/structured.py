"""Structured outputs on the wire: OpenAI `response_format`, vLLM `structured_outputs` (and its older
`guided_*` fields), and forced tool calls, turned into one grammar for `engine.grammar`.

Every problem with the constraint itself is a 400 naming the field and what is wrong. `strict` in a
`json_schema` response format is accepted either way and the schema is always enforced, as vLLM does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.service import ServiceError
from engine.grammar import (
    ENGINE,
    CompiledGrammar,
    GrammarCompiler,
    GrammarError,
    GrammarTimeout,
    choice_grammar,
    json_schema_grammar,
    lark_grammar,
    regex_grammar,
    tool_call_grammar,
)

FORMATS = ("json_schema", "json_object", "regex", "choice", "grammar")


class _JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    # OpenAI names it `schema`; vLLM also reads `json_schema`.
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one of json, regex, choice, grammar, json_object."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # Accepted for compatibility; already how this server decodes (no free whitespace, one engine).
    disable_any_whitespace: bool | None = None
    disable_fallback: bool | None = None


def requested_grammar(request: Any, *, chat: bool) -> tuple[str, str] | None:
    """(the request field, the llguidance grammar text) a request asks for, or None for free text.

    Raises ServiceError 400 when the constraint is malformed or more than one is given."""
    sources = []
    if request.response_format is not None:
        sources.append(("response_format", _from_response_format(request.response_format)))
    guided = _guided_fields(request)
    if request.structured_outputs is not None or guided:
        if request.structured_outputs is not None and guided:
            raise _bad("give structured_outputs or the older guided_* fields, not both")
        raw = request.structured_outputs if request.structured_outputs is not None else guided
        sources.append(("structured_outputs", _from_structured_outputs(raw)))
    if chat:
        forced = _forced_tools(request)
        if forced is not None:
            sources.append(("tool_choice", forced))
    sources = [(name, grammar) for name, grammar in sources if grammar is not None]
    if len(sources) > 1:
        raise _bad("only one constraint per request: got " + ", ".join(name for name, _ in sources))
    return sources[0] if sources else None


async def compile_grammar(compiler: GrammarCompiler | None, field: str, grammar: str) -> CompiledGrammar:
    """Compile off the event loop and the engine thread; slow or invalid constraints become 400s."""
    if compiler is None:
        raise ServiceError(400, "structured_outputs_unavailable",
                           "structured outputs are not available for this model (its tokenizer is not supported "
                           "by the grammar engine); send requests without a constraint")
    try:
        return await asyncio.to_thread(compiler.compile, grammar)
    except GrammarTimeout as exc:
        raise ServiceError(400, "grammar_too_complex", f"{field}: {exc}") from None
    except GrammarError as exc:
        raise ServiceError(400, "invalid_structured_output", f"{field} is invalid: {exc}") from None


def capabilities() -> dict[str, Any]:
    """What a client can ask for; published in /v1/models and /v1/stats."""
    return {"engine": ENGINE, "formats": list(FORMATS),
            "request_fields": ["response_format", "structured_outputs", "tool_choice"],
            "tool_choice": ["none", "auto", "required", "named"]}


def _from_response_format(raw: dict[str, Any]) -> str | None:
    try:
        fmt = ResponseFormat.model_validate(raw)
    except ValidationError as exc:
        raise _bad(f"response_format: {_first_problem(exc)}") from None
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return json_schema_grammar({"type": "object"})
    if fmt.json_schema is None:
        raise _bad("response_format.json_schema is required when type is 'json_schema' "
                   "(an object with name and schema)")
    schema = fmt.json_schema.schema_
    if schema is None:
        raw_inner = raw.get("json_schema") or {}
        schema = raw_inner.get("json_schema") if isinstance(raw_inner.get("json_schema"), dict) else None
    if schema is None:
        raise _bad("response_format.json_schema.schema is required: the JSON schema the answer must follow")
    return _json_schema(schema, "response_format.json_schema.schema")


def _from_structured_outputs(raw: Any) -> str | None:
    if not isinstance(raw, dict):
        raise _bad(f"structured_outputs must be an object, got {type(raw).__name__}")
    try:
        spec = StructuredOutputs.model_validate(raw)
    except ValidationError as exc:
        raise _bad(f"structured_outputs: {_first_problem(exc)}") from None
    given = [k for k in ("json", "regex", "choice", "grammar", "json_object") if raw.get(k) not in (None, False)]
    if len(given) != 1:
        raise _bad(f"structured_outputs needs exactly one of json, regex, choice, grammar, json_object; got "
                   f"{given or 'none'}")
    if spec.json_ is not None:
        schema = spec.json_
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise _bad(f"structured_outputs.json is not valid JSON: {exc}") from None
        return _json_schema(schema, "structured_outputs.json")
    if spec.regex is not None:
        if not spec.regex:
            raise _bad("structured_outputs.regex is empty")
        return regex_grammar(spec.regex)
    if spec.choice is not None:
        return _named("structured_outputs.choice", choice_grammar, spec.choice)
    if spec.grammar is not None:
        return _named("structured_outputs.grammar", lark_grammar, spec.grammar)
    return json_schema_grammar({"type": "object"})


def _guided_fields(request: Any) -> dict[str, Any]:
    """vLLM's pre-0.11 fields (guided_json, guided_regex, guided_choice, guided_grammar) as structured_outputs."""
    fields = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
              "guided_grammar": "grammar"}
    return {new: getattr(request, old) for old, new in fields.items() if getattr(request, old) is not None}


def _forced_tools(request: Any) -> str | None:
    choice = request.tool_choice
    if choice in (None, "auto", "none"):
        return None
    if choice == "required":
        name = None
    elif isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str):
        name = choice["function"]["name"]
    else:
        raise _bad("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
                   f"{{\"name\": ...}}}}, got {json.dumps(choice)[:200]}")
    if not request.tools:
        raise _bad(f"tool_choice {json.dumps(choice)[:100]} needs tools: the request has none")
    return _named("tool_choice", tool_call_grammar, request.tools, name)


def _json_schema(schema: Any, field: str) -> str:
    if not isinstance(schema, dict | bool):
        raise _bad(f"{field} must be a JSON schema object, got {type(schema).__name__}")
    return _named(field, json_schema_grammar, schema)


def _named(field: str, build: Any, *args: Any) -> str:
    """Run a grammar builder, naming `field` in any error."""
    try:
        return build(*args)
    except GrammarError as exc:
        raise _bad(f"{field}: {exc}") from None


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"])
    return f"{where}: {error['msg']}" if where else error["msg"]


def _bad(message: str) -> ServiceError:
    return ServiceError(400, "invalid_structured_output", message)
