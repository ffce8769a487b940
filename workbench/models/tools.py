"""Tool calls for models that only produce text: how a chat template takes tools, how a
conversation with tool calls and tool results is handed to it, and how calls are parsed back
out of the generated text.

Three syntaxes cover the open instruct models, each chosen from the chat template's text:

- `hermes` (Hermes, Qwen 2/2.5/3, SmolLM3, most templates that take `tools`): each call is
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
- `llama3_json` (Llama 3.1-3.3 with custom tools): the whole reply is a bare JSON object
  `{"name": ..., "parameters": {...}}` (several separated by `;`), optionally after
  `<|python_tag|>`;
- `mistral`: `[TOOL_CALLS]` and a JSON list of `{"name", "arguments"}` (v3 tokenizers) or
  `[TOOL_CALLS]name[ARGS]{...}` (v11 and later).

A template that does not take `tools` at all (SmolLM2's) gets a generic description of the
tools in the system prompt asking for the Hermes syntax (`generic_tool_prompt`); its earlier
tool calls are written back in that syntax, and tool results become a user turn that starts
with the tool's name ("Result of get_weather:"), since such templates know no `tool` role.
Parsing never raises: text that does not parse comes back unchanged with no calls.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.models.messages import NamedToolChoice, ToolCall, ToolChoice, ToolSpec

FAMILIES = ("hermes", "llama3_json", "mistral")
# Special tokens that carry tool-call syntax; decoding must keep them.
MARKERS = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]",
           "<|python_tag|>")


@dataclass(frozen=True)
class TemplateTools:
    """What a chat template does with tools, read from its Jinja source."""

    family: str  # the syntax generated calls are parsed with (one of FAMILIES)
    native: bool  # the template takes `tools=` (otherwise: generic_tool_prompt)
    renders_tool_calls: bool  # it writes an assistant turn's `tool_calls` itself
    tool_role: bool  # it renders `tool` turns itself
    known_family: bool = True  # False: takes tools, but no syntax we recognise

    @classmethod
    def of(cls, template: str | None) -> TemplateTools:
        tpl = template or ""
        native = re.search(r"\btools\b", tpl) is not None
        if "[TOOL_CALLS]" in tpl:
            family = "mistral"
        elif "<tool_call>" in tpl or not native:
            family = "hermes"
        elif "<|python_tag|>" in tpl or "<|start_header_id|>" in tpl:
            family = "llama3_json"
        else:
            family = "hermes"
        known = not native or "[TOOL_CALLS]" in tpl or "<tool_call>" in tpl or \
            family == "llama3_json"
        return cls(family=family, native=native,
                   renders_tool_calls=native and "tool_calls" in tpl,
                   tool_role=native and re.search(r"""["']tool["']""", tpl) is not None,
                   known_family=known)


# --- prompts ---------------------------------------------------------------------------------

def generic_tool_prompt(tools: Sequence[ToolSpec], choice: ToolChoice = "auto") -> str:
    """Tool instructions for a model whose template takes no tools (Hermes syntax)."""
    lines = ["# Tools", "",
             "You can call functions to help with the request. Their signatures, one JSON "
             "object per line:", "<tools>",
             *(json.dumps(t.model_dump(mode="json", exclude_none=True), ensure_ascii=False)
               for t in tools),
             "</tools>", "",
             "To call a function, write one block per call holding a JSON object with the "
             "function's name and its arguments:",
             "<tool_call>", '{"name": "<function name>", "arguments": {<arguments>}}',
             "</tool_call>",
             "A function's result comes back in a turn that starts with \"Result of <function "
             "name>:\"."]
    if choice == "required":
        lines.append("Call at least one function now.")
    elif isinstance(choice, NamedToolChoice):
        lines.append(f"Call the function {choice.function.name} now.")
    return "\n".join(lines)


def tool_call_text(calls: Sequence[dict[str, Any]]) -> str:
    """Calls written in the Hermes syntax (the form generic_tool_prompt asks for)."""
    blocks = []
    for tc in calls:
        fn = tc["function"]
        blocks.append("<tool_call>\n" + json.dumps(
            {"name": fn["name"], "arguments": _arguments_value(fn.get("arguments"))},
            ensure_ascii=False) + "\n</tool_call>")
    return "\n".join(blocks)


def tool_result_prefix(name: str) -> str:
    return f"Result of {name}:\n"


def _arguments_value(arguments: Any) -> Any:
    """Templates expect arguments as an object (`| tojson`); keep invalid JSON as text."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return {} if arguments is None else arguments


def _mistral_id(call_id: str) -> str:
    """Mistral templates refuse ids that are not 9 alphanumerics; map others stably."""
    if re.fullmatch(r"[A-Za-z0-9]{9}", call_id):
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def template_messages(conv: Sequence[dict[str, Any]], how: TemplateTools,
                      tools: Sequence[ToolSpec] | None, choice: ToolChoice = "auto"
                      ) -> list[dict[str, Any]]:
    """The messages to give `apply_chat_template` (plain OpenAI dicts in, template-ready out).

    `tools` is what the prompt should offer (None: no tools); with a template that does not
    take tools they are described in the system prompt."""
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for m in conv:
        role = m["role"]
        msg: dict[str, Any] = {"role": role, "content": m.get("content") or ""}
        if m.get("reasoning_content") is not None:
            msg["reasoning_content"] = m["reasoning_content"]
        calls = m.get("tool_calls") or []
        for tc in calls:
            names[tc["id"]] = tc["function"]["name"]
        if role == "assistant" and calls:
            if how.renders_tool_calls:
                msg["tool_calls"] = [
                    {"id": _mistral_id(tc["id"]) if how.family == "mistral" else tc["id"],
                     "type": "function",
                     "function": {"name": tc["function"]["name"],
                                  "arguments": _arguments_value(tc["function"].get(
                                      "arguments"))}}
                    for tc in calls]
            else:
                msg["content"] = "\n".join(x for x in (msg["content"], tool_call_text(calls))
                                           if x)
        elif role == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id") or "", "tool")
            if how.tool_role:
                if m.get("tool_call_id"):
                    msg["tool_call_id"] = _mistral_id(m["tool_call_id"]) \
                        if how.family == "mistral" else m["tool_call_id"]
                msg["name"] = name
            else:
                text = tool_result_prefix(name) + msg["content"]
                if out and out[-1].get("_tool_results"):
                    out[-1]["content"] += "\n\n" + text  # parallel calls: one user turn
                    continue
                msg = {"role": "user", "content": text, "_tool_results": True}
        elif m.get("name") is not None:
            msg["name"] = m["name"]
        out.append(msg)
    for msg in out:
        msg.pop("_tool_results", None)
    if tools and not how.native:
        prompt = generic_tool_prompt(tools, choice)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def forced_prefix(how: TemplateTools, choice: ToolChoice, template: str | None) -> str:
    """Text put at the start of the assistant turn so that the model must call a tool
    (tool_choice "required") or the named one; "" for "auto" and "none"."""
    if choice in ("auto", "none"):
        return ""
    name = choice.function.name if isinstance(choice, NamedToolChoice) else None
    if how.family == "mistral":
        if "[ARGS]" in (template or ""):
            return f"[TOOL_CALLS]{name}[ARGS]" if name else "[TOOL_CALLS]"
        return f'[TOOL_CALLS][{{"name": "{name}", "arguments": ' if name else "[TOOL_CALLS]["
    if how.family == "llama3_json":
        return f'{{"name": "{name}", "parameters": ' if name else '{"name": "'
    return f'<tool_call>\n{{"name": "{name}", "arguments": ' if name else "<tool_call>\n"


# --- parsing ---------------------------------------------------------------------------------

def parse_tool_calls(text: str, family: str, names: Sequence[str] | None = None
                     ) -> tuple[str, list[ToolCall]]:
    """(content, tool calls) of a generated reply; (text, []) when it holds no call or any
    call fails to parse. `names`, when given, are the callable tools: a bare-JSON reply
    (llama3_json) only counts as a call when it names one of them."""
    if family not in FAMILIES:
        raise ValueError(f"unknown tool-call syntax {family!r} (one of {', '.join(FAMILIES)})")
    try:
        parsed = _PARSERS[family](text, names)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return text, []  # RecursionError: JSON nested past what json.loads reads
    return parsed if parsed is not None and parsed[1] else (text, [])


def _call(obj: Any, *, id: str | None = None, keys: tuple[str, ...] = ("arguments",
                                                                       "parameters")
          ) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise ValueError("not a call")
    args: Any = {}
    for k in keys:
        if k in obj:
            args = obj[k]
            break
    if not isinstance(args, (dict, str)):
        raise ValueError("arguments are not an object")
    return ToolCall.make(obj["name"], args, id=id)


def _decode_all(body: str, sep: str = "") -> list[Any]:
    """Every JSON value in `body`, separated by whitespace (and `sep`); raises on anything
    else."""
    dec, i, out = json.JSONDecoder(), 0, []
    body = body.strip()
    while i < len(body):
        obj, i = dec.raw_decode(body, i)
        out.append(obj)
        while i < len(body) and (body[i].isspace() or body[i] in sep):
            i += 1
    return out


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def _hermes(text: str, names) -> tuple[str, list[ToolCall]] | None:
    if "<tool_call>" not in text:
        return None
    calls = []
    for m in _HERMES.finditer(text):
        objs = _decode_all(m.group(1))
        if len(objs) != 1:
            raise ValueError("one JSON object per <tool_call>")
        calls.append(_call(objs[0]))
    return _HERMES.sub("", text).strip(), calls


def _llama3_json(text: str, names) -> tuple[str, list[ToolCall]] | None:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return None
    calls = [_call(o, keys=("parameters", "arguments")) for o in _decode_all(body, ";")]
    if names is not None and any(c.function.name not in names for c in calls):
        return None  # a JSON answer, not a call
    return "", calls


def _mistral(text: str, names) -> tuple[str, list[ToolCall]] | None:
    k = text.find("[TOOL_CALLS]")
    if k < 0:
        return None
    content, rest = text[:k].strip(), text[k + len("[TOOL_CALLS]"):].strip()
    if rest.startswith("["):
        (objs,) = _decode_all(rest)
        calls = [_call(o, id=_mistral_call_id(o.get("id"))) for o in objs]
    else:
        calls = []
        for part in rest.split("[TOOL_CALLS]"):
            name, sep, args = part.partition("[ARGS]")
            if not sep:
                raise ValueError("no [ARGS]")
            (obj,) = _decode_all(args)
            calls.append(_call({"name": name.strip(), "arguments": obj},
                               id=_mistral_call_id(None)))
    return content, calls


def _mistral_call_id(given: Any) -> str:
    return given if isinstance(given, str) and given else uuid.uuid4().hex[:9]


_PARSERS = {"hermes": _hermes, "llama3_json": _llama3_json, "mistral": _mistral}


def strip_special_tokens(text: str, specials: Sequence[str]) -> str:
    """Remove special-token text except the tool-call markers (decoded with specials kept)."""
    for s in specials:
        if s and s not in MARKERS:
            text = text.replace(s, "")
    return text
