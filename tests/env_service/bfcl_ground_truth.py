"""BFCL ground truth as assistant messages, for replay tests of the `bfcl` environment.

In BFCL's own format (`[cd('archives'), mv(source='a', destination='b')]`) the calls go unchanged,
positional arguments included (160 calls): the environment names them from the backend methods'
signatures. The JSON formats (`<tool_call>`, OpenAI tool_calls) can only carry named arguments, so
for those the names are read from the same signatures here.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
from functools import cache

from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

from common.schemas import ChatMessage, ToolCall, ToolFunction


@cache
def _parameter_names(class_name: str, method: str) -> tuple[str, ...] | None:
    cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
    if not hasattr(cls, method):
        return None
    return tuple(p for p in inspect.signature(getattr(cls, method)).parameters if p != "self")


def keyword_call(call: str, classes: list[str]) -> str:
    node = ast.parse(call, mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name), call
    if not node.args:
        return call
    for class_name in classes:
        names = _parameter_names(class_name, node.func.id)
        if names is not None:
            node.keywords = [ast.keyword(arg=n, value=a) for n, a in zip(names[:len(node.args)], node.args, strict=True)] + node.keywords
            node.args = []
            return ast.unparse(node)
    raise KeyError(f"no involved class has a method {node.func.id}")


def turn_message(calls: list[str], classes: list[str], style: str = "bfcl") -> dict:
    """One assistant message holding all of a turn's calls, as a JSON-able dict.

    style: "bfcl" (`[f(a=1), g(b=2)]`), "tool_call" (`<tool_call>` blocks) or "openai" (tool_calls).
    """
    if style == "bfcl":
        return {"role": "assistant", "content": "[" + ", ".join(calls) + "]"}
    named = [keyword_call(c, classes) for c in calls]
    parsed = [ast.parse(c, mode="eval").body for c in named]
    as_json = [{"name": p.func.id, "arguments": {k.arg: ast.literal_eval(k.value) for k in p.keywords}}
               for p in parsed]
    if style == "tool_call":
        blocks = "".join(f"<tool_call>{json.dumps(c)}</tool_call>\n" for c in as_json)
        return {"role": "assistant", "content": blocks}
    if style == "openai":
        calls_ = [ToolCall(function=ToolFunction(name=c["name"], arguments=json.dumps(c["arguments"])))
                  for c in as_json]
        return ChatMessage(role="assistant", content="", tool_calls=calls_).model_dump(exclude_none=True)
    raise ValueError(style)


NO_CALL = {"role": "assistant", "content": "Done with this request."}


def is_positional(call: str) -> bool:
    node = ast.parse(call, mode="eval").body
    return isinstance(node, ast.Call) and bool(node.args)
