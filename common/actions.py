"""Parse tool calls out of an assistant message, in every format an agent may use.

Shared by the tool-API environments (flights, bfcl, ...) and the judge's reference rule. Usage::

    from common.actions import ActionParseError, ParsedCall, parse_actions

    try:
        calls = parse_actions(message)          # message: common.schemas.ChatMessage
    except ActionParseError as exc:
        observation = f"Could not parse your tool call: {exc}"   # explain, never crash
    for call in calls:
        call.name, call.arguments               # str, dict[str, Any]
        call.to_python()                        # "cd(folder='x')": BFCL's executable form

Accepted formats (checked in this order):

1. OpenAI `tool_calls` on the message (`function.arguments` is a JSON string or object);
   the content is then ignored.
2. `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Qwen/Hermes style),
   one or more; `arguments` may also be a JSON-encoded string; a block may hold a JSON list of calls.
3. Python-style calls: `search_flight(origin='SFO', destination='JFK')`; positional arguments
   (`sort('final_report.pdf')`, as BFCL's own ground truth and many models write them) are named
   from the function's parameters, which the environment supplies (`parameters=`),
   several on separate lines or separated by `;`, or a list of them (BFCL's format:
   `[cd(folder='x'), mv(source='a', destination='b')]`). Argument values are Python literals
   (strings, numbers, True/False/None, lists, dicts; JSON's true/false/null are accepted too).
   The calls may stand alone, inside a ``` fence, or on their own lines amid prose.
4. A bare JSON object `{"name": ..., "arguments": {...}}` (or a list of them) as the whole content.

A message with no call at all returns `[]` (for BFCL that ends the user turn). A message that
tries to call something but gets the syntax wrong raises `ActionParseError` whose text says what
is wrong and how to write it, suitable to show to the agent as the observation.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.schemas import ChatMessage

__all__ = ["ActionParseError", "ParsedCall", "parse_actions", "parse_python_calls"]

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\s*\n?(.*?)```", re.DOTALL)
# Something that looks like an attempt at a call: `name(` or `[name(` at the start of a line.
_CALL_ATTEMPT = re.compile(r"^\s*\[?\s*[A-Za-z_][\w.]*\(", re.MULTILINE)
_JSON_NAMES = {"true": True, "false": False, "null": None}
_EXAMPLE = "write calls like search_flight(origin='SFO', destination='JFK')"


class ActionParseError(ValueError):
    """The message tries to call a tool but the call is malformed. The text is agent-readable."""


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    call_id: str | None = None  # the OpenAI tool_call id, when the call came as one
    positional: tuple[Any, ...] = ()  # not yet named; parse_actions names them from the function's parameters

    def to_python(self) -> str:
        """The call as Python source with keyword arguments, e.g. `cd(folder='x')`."""
        args = ", ".join([*(repr(value) for value in self.positional),
                          *(f"{key}={value!r}" for key, value in self.arguments.items())])
        return f"{self.name}({args})"


# The ordered parameter names of a function, or None when the environment has no such function.
ParameterLookup = Callable[[str], Sequence[str] | None]


def parse_actions(message: ChatMessage, parameters: ParameterLookup | None = None) -> list[ParsedCall]:
    """All tool calls in `message`, in order. `[]` when it holds none; ActionParseError when malformed.

    `parameters` names positional arguments; without it (or for an unknown function) they are an error.
    """
    if message.tool_calls:
        return [_from_openai(tc.function.name, tc.function.arguments, tc.id) for tc in message.tool_calls]
    return [_bind(call, parameters) for call in parse_text_actions(message.text())]


def _bind(call: ParsedCall, parameters: ParameterLookup | None) -> ParsedCall:
    if not call.positional:
        return call
    names = parameters(call.name) if parameters is not None else None
    if names is None:
        raise ActionParseError(f"{call.name}(...): positional arguments need a known function; pass every "
                               f"argument by name, e.g. {call.name}(argument_name=value)")
    names = list(names)
    if len(call.positional) > len(names):
        raise ActionParseError(f"{call.name}() takes {len(names)} argument(s) ({', '.join(names)}), "
                               f"got {len(call.positional)} positional")
    bound = dict(zip(names, call.positional, strict=False))  # fewer positionals than parameters is fine
    twice = sorted(set(bound) & set(call.arguments))
    if twice:
        raise ActionParseError(f"{call.name}(...): {', '.join(twice)} given both by position and by name")
    return ParsedCall(call.name, {**bound, **call.arguments}, call.call_id)


def parse_text_actions(text: str) -> list[ParsedCall]:
    """Tool calls in plain assistant text (formats 2-4 of the module docstring)."""
    if "<tool_call>" in text:
        calls: list[ParsedCall] = []
        for block in _TOOL_CALL_BLOCK.findall(text):
            calls.extend(_from_json_text(block.strip(), "<tool_call> block"))
        return calls
    stripped = text.strip()
    if not stripped:
        return []
    if stripped[0] in "{[" and _looks_like_json_call(stripped):
        return _from_json_text(stripped, "JSON call")
    fenced = _FENCE.findall(stripped)
    candidates = [block.strip() for block in fenced] if fenced else [stripped]
    calls = []
    for candidate in candidates:
        calls.extend(_python_calls_in(candidate))
    return calls


def parse_python_calls(source: str) -> list[ParsedCall]:
    """Parse source that must consist only of calls (or lists of calls); raises ActionParseError."""
    try:
        tree = ast.parse(source.strip(), mode="exec")
    except SyntaxError as exc:
        raise ActionParseError(f"invalid call syntax ({exc.msg}) in {source.strip()[:200]!r}; {_EXAMPLE}") from None
    calls: list[ParsedCall] = []
    for statement in tree.body:
        if not isinstance(statement, ast.Expr):
            raise ActionParseError(f"only function calls are allowed, got {ast.unparse(statement)[:120]!r}; {_EXAMPLE}")
        calls.extend(_calls_of_expression(statement.value))
    return calls


# ---------------------------------------------------------------- python-style calls


def _python_calls_in(text: str) -> list[ParsedCall]:
    """The whole text as calls; failing that, the lines that are calls (the rest is prose)."""
    try:
        return parse_python_calls(text)
    except ActionParseError as whole_error:
        if "\n" not in text.strip():
            if _CALL_ATTEMPT.match(text):
                raise
            return []
        calls: list[ParsedCall] = []
        for line in text.splitlines():
            if not _CALL_ATTEMPT.match(line):
                continue
            calls.extend(parse_python_calls(line))  # a broken call line is an error, not prose
        if not calls and _CALL_ATTEMPT.search(text):
            raise whole_error from None
        return calls


def _calls_of_expression(node: ast.expr) -> list[ParsedCall]:
    if isinstance(node, (ast.List, ast.Tuple)):
        calls: list[ParsedCall] = []
        for element in node.elts:
            calls.extend(_calls_of_expression(element))
        return calls
    if not isinstance(node, ast.Call):
        raise ActionParseError(f"expected a function call, got {ast.unparse(node)[:120]!r}; {_EXAMPLE}")
    name = _dotted_name(node.func)
    positional = []
    for n, argument in enumerate(node.args):
        if isinstance(argument, ast.Starred):
            raise ActionParseError(f"{name}(...): *args is not supported; pass every argument by name")
        positional.append(_literal(argument, f"{name}(... argument {n + 1} ...)"))
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise ActionParseError(f"{name}(...): **kwargs is not supported; pass every argument by name")
        arguments[keyword.arg] = _literal(keyword.value, f"{name}(..., {keyword.arg}=...)")
    return [ParsedCall(name, arguments, positional=tuple(positional))]


def _dotted_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr}"
    raise ActionParseError(f"cannot call {ast.unparse(node)[:80]!r}: a function name is expected; {_EXAMPLE}")


def _literal(node: ast.expr, where: str) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_literal(e, where) for e in node.elts]
        return items if not isinstance(node, ast.Tuple) else tuple(items)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ActionParseError(f"{where}: dict unpacking is not supported")
        return {_literal(k, where): _literal(v, where) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ActionParseError(
            f"{where}: the value {ast.unparse(node)[:80]!r} is not a literal; quote strings, "
            f"e.g. origin='SFO'") from None


# ---------------------------------------------------------------- JSON calls


def _looks_like_json_call(text: str) -> bool:
    return bool(re.match(r'^\s*[\[{]\s*(\{\s*)?"(name|function)"', text))


def _from_json_text(text: str, what: str) -> list[ParsedCall]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ActionParseError(
            f"{what} is not valid JSON ({exc.msg} at char {exc.pos}); write "
            '<tool_call>{"name": "tool_name", "arguments": {"arg": "value"}}</tool_call>') from None
    items = data if isinstance(data, list) else [data]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name") or item.get("function"), (str, dict)):
            raise ActionParseError(f'{what} must be an object with "name" and "arguments", got {text[:120]!r}')
        if isinstance(item.get("function"), dict):  # an OpenAI tool_call object pasted as text
            function = item["function"]
            calls.append(_from_openai(function.get("name", ""), function.get("arguments", {}), item.get("id")))
        else:
            calls.append(_from_openai(item.get("name") or item.get("function"),
                                      item.get("arguments", item.get("parameters", {})), None))
    return calls


def _from_openai(name: Any, arguments: Any, call_id: str | None) -> ParsedCall:
    if not isinstance(name, str) or not name:
        raise ActionParseError("a tool call has no function name")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ActionParseError(f"{name}: arguments are not valid JSON ({exc.msg}); "
                                   'send a JSON object like {"origin": "SFO"}') from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ActionParseError(f"{name}: arguments must be a JSON object of name -> value, "
                               f"got {type(arguments).__name__}")
    return ParsedCall(name, arguments, call_id)
