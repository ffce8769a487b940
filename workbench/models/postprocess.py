"""What the local backends (transformers, CTranslate2) do to decoded text: cut it at the
first stop string, and read the tool calls it holds into the generation."""

from __future__ import annotations

from collections.abc import Sequence

from workbench.models.base import Generation
from workbench.models.tools import parse_tool_calls
from workbench.records import ToolCall


def with_tool_calls(gen: Generation, prefix: str, family: str,
                    names: list[str], forced: bool = False) -> Generation:
    """The generation with the tool calls its text holds; unchanged text when none parse. A
    forced call cut by max_tokens comes back as OpenAI returns it: the call with the
    arguments written so far (not valid JSON) and finish_reason "length"."""
    content, calls = parse_tool_calls(prefix + gen.text, family, names)
    if not calls and forced and gen.finish_reason == "length":
        partial = _partial_call(prefix + gen.text, names)
        if partial is not None:
            gen.text, gen.tool_calls = "", [partial]
            return gen
    if not calls:
        gen.text = prefix + gen.text
        return gen
    gen.text, gen.tool_calls, gen.finish_reason = content, calls, "tool_calls"
    return gen


def _partial_call(text: str, names: list[str]):
    """The call a forced tool call cut short was writing: its name and the arguments text so
    far (every family writes the name first, then the arguments)."""
    import re

    m = re.search(r'"name":\s*"([^"]+)",\s*"(?:arguments|parameters)":\s*', text) or \
        re.search(r"\[TOOL_CALLS\]([A-Za-z0-9_.\-]+)\[ARGS\]", text)
    if m is None or m.group(1) not in names:
        return None
    return ToolCall.make(m.group(1), text[m.end():])


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """`text` up to its first stop string, and whether one was found."""
    cut = len(text)
    for s in stops:
        k = text.find(s)
        if k != -1:
            cut = min(cut, k)
    return text[:cut], cut < len(text)
