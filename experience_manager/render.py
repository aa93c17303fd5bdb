"""Render retrieved experiences as text for the prompt, in ReMe's "when to use / content" format.

The trainer wraps this block in its own markers (`<EXP>...</EXP>`) and strips it before the loss, so the
block itself never contains markers (ingestion rejects them).
"""

from __future__ import annotations


def render_experiences(items: list[tuple[str, str]]) -> str:
    """ReMe's memory block (RewriteMemoryOp without the LLM rewrite); empty when nothing was found."""
    return "\n".join(f"Memory {i} :\n When to use: {when}\n Content: {content}\n"
                     for i, (when, content) in enumerate(items, start=1))
