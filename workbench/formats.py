"""SFT dataset formats: OpenAI `messages`, ShareGPT and Alpaca, converted losslessly.

`messages` is the native form (`ChatExample`). ShareGPT maps `human`/`gpt`/`system`/
`observation` to `user`/`assistant`/`system`/`tool`; TRL's `maybe_convert_to_chatml` renames
keys only and keeps `human`/`gpt` as roles, which chat templates then reject. Tool use follows
LLaMA-Factory's ShareGPT: a `function_call` turn is an assistant turn whose value is the JSON
call `{"name", "arguments"}` (a list for parallel calls), an `observation` turn is the tool
result, and `tools` is the JSON text of the function list. ShareGPT has no call ids, so
reading gives each call the id `call_<turn>_<k>` and each observation the id of the oldest
call not yet answered; an assistant turn with both text and calls has no ShareGPT form.
Alpaca holds the last exchange in `instruction`/`input`/`output`, earlier turns in `history`
(LLaMA-Factory's layout) and the system prompt in `system`; it has no tools. Reasoning travels
inside `<think>` tags in formats that have no field for it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from workbench.errors import DataError
from workbench.io import _error_code, describe_validation_error, iter_jsonl_raw, write_jsonl
from workbench.records import (
    LETTERS,
    ChatExample,
    Message,
    PreferencePair,
    QTSASample,
    RecordError,
    ToolCall,
    ToolSpec,
)

Format = Literal["messages", "sharegpt", "alpaca"]
FORMATS: tuple[str, ...] = ("messages", "sharegpt", "alpaca")

SHAREGPT_TO_ROLE = {"human": "user", "gpt": "assistant", "system": "system",
                    "observation": "tool", "function_call": "assistant"}
ROLE_TO_SHAREGPT = {"user": "human", "assistant": "gpt", "system": "system", "tool": "observation"}

_THINK = re.compile(r"\A<think>\n(.*?)\n</think>\n\n(.*)\Z", re.DOTALL)


def join_reasoning(reasoning: str | None, content: str) -> str:
    """Put reasoning into the content as a `<think>` block (the form thinking models emit)."""
    return content if reasoning is None else f"<think>\n{reasoning}\n</think>\n\n{content}"


def split_reasoning(text: str) -> tuple[str | None, str]:
    """Inverse of `join_reasoning`: (reasoning or None, content)."""
    m = _THINK.match(text)
    return (m.group(1), m.group(2)) if m else (None, text)


def detect_format(obj: Any) -> Format:
    if isinstance(obj, dict):
        if "messages" in obj:
            return "messages"
        if "conversations" in obj:
            return "sharegpt"
        if "instruction" in obj and "output" in obj:
            return "alpaca"
    raise RecordError("cannot tell the format: expected a 'messages', 'conversations' or "
                      "'instruction'+'output' key", "unknown_format")


def _need_str(obj: dict, key: str, where: str) -> str:
    if key not in obj:
        raise RecordError(f"{where}{key}: missing field", "missing_field")
    v = obj[key]
    if not isinstance(v, str):
        raise RecordError(f"{where}{key}: expected a string, got {type(v).__name__}",
                          "wrong_type")
    return v


def _sharegpt_calls(value: str, turn: int) -> list[ToolCall]:
    where = f"conversations.{turn}.value"
    try:
        obj = json.loads(value)
    except ValueError as e:
        raise RecordError(f"{where}: a function_call must be JSON ({e})", "bad_tool_call") \
            from None
    calls = obj if isinstance(obj, list) else [obj]
    out = []
    for k, c in enumerate(calls):
        if not (isinstance(c, dict) and isinstance(c.get("name"), str) and c["name"]):
            raise RecordError(f"{where}: expected {{\"name\": ..., \"arguments\": {{...}}}}",
                              "bad_tool_call")
        out.append(ToolCall.make(c["name"], c.get("arguments"), id=f"call_{turn}_{k}"))
    return out


def _sharegpt_tools(value: Any) -> list[ToolSpec]:
    try:
        items = json.loads(value) if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ValueError("expected a list")
        return [ToolSpec.model_validate(t if t.get("type") == "function" and "function" in t
                                        else {"type": "function", "function": t})
                for t in items]
    except (ValueError, AttributeError) as e:
        raise RecordError(f"tools: expected the JSON text of a list of functions ({e})",
                          "bad_tools") from None


def from_sharegpt(obj: Any) -> ChatExample:
    if not isinstance(obj, dict):
        raise RecordError("expected a JSON object", "wrong_type")
    turns = obj.get("conversations")
    if not isinstance(turns, list):
        raise RecordError("conversations: expected a list", "wrong_type")
    messages = []
    system = obj.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise RecordError("system: expected a string", "wrong_type")
        messages.append(Message(role="system", content=system))
    pending: list[ToolCall] = []  # calls not answered yet, oldest first
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise RecordError(f"conversations.{i}: expected an object", "wrong_type")
        who = _need_str(t, "from", f"conversations.{i}.")
        if who not in SHAREGPT_TO_ROLE:
            raise RecordError(f"conversations.{i}.from: unknown ShareGPT role {who!r} "
                              f"(expected one of {', '.join(SHAREGPT_TO_ROLE)})", "unknown_role")
        role = SHAREGPT_TO_ROLE[who]
        value = _need_str(t, "value", f"conversations.{i}.")
        if who == "function_call":
            reasoning, call_text = split_reasoning(value)
            calls = _sharegpt_calls(call_text, i)
            pending += calls
            messages.append(Message(role="assistant", reasoning_content=reasoning,
                                    tool_calls=calls))
            continue
        if role == "tool":
            answered = pending.pop(0) if pending else None
            messages.append(Message(role="tool", content=value,
                                    tool_call_id=answered.id if answered else None,
                                    name=answered.function.name if answered else None))
            continue
        reasoning, content = split_reasoning(value) if role == "assistant" else (None, value)
        messages.append(Message(role=role, content=content, reasoning_content=reasoning))
    tools = _sharegpt_tools(obj["tools"]) if obj.get("tools") else None
    extra = {k: v for k, v in obj.items() if k not in ("conversations", "system", "id", "tools")}
    return ChatExample(messages=messages, tools=tools, id=obj.get("id"), metadata=extra or None)


def _sharegpt_turn(m: Message) -> dict[str, str]:
    if not m.tool_calls:
        return {"from": ROLE_TO_SHAREGPT[m.role],
                "value": join_reasoning(m.reasoning_content, m.content or "")}
    if m.content:
        raise RecordError("ShareGPT cannot hold an assistant turn with both text and tool "
                          "calls; export as messages", "unsupported")
    calls = [{"name": tc.function.name, "arguments": _json_or_text(tc.function.arguments)}
             for tc in m.tool_calls]
    value = json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)
    return {"from": "function_call", "value": join_reasoning(m.reasoning_content, value)}


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def to_sharegpt(ex: ChatExample) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if ex.id is not None:
        out["id"] = ex.id
    msgs = ex.messages
    if msgs and msgs[0].role == "system":
        out["system"] = msgs[0].content
        msgs = msgs[1:]
    out["conversations"] = [_sharegpt_turn(m) for m in msgs]
    if ex.tools:
        out["tools"] = json.dumps([t.function.model_dump(mode="json", exclude_none=True)
                                   for t in ex.tools], ensure_ascii=False)
    out.update(ex.metadata or {})
    return out


def from_alpaca(obj: Any) -> ChatExample:
    if not isinstance(obj, dict):
        raise RecordError("expected a JSON object", "wrong_type")
    instruction = _need_str(obj, "instruction", "")
    output = _need_str(obj, "output", "")
    inp = obj.get("input", "")
    if not isinstance(inp, str):
        raise RecordError("input: expected a string", "wrong_type")
    messages: list[Message] = []
    system = obj.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise RecordError("system: expected a string", "wrong_type")
        messages.append(Message(role="system", content=system))
    history = obj.get("history") or []
    if not isinstance(history, list):
        raise RecordError("history: expected a list of [user, assistant] pairs", "wrong_type")
    for i, pair in enumerate(history):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise RecordError(f"history.{i}: expected [user, assistant] strings", "wrong_type")
        r, c = split_reasoning(pair[1])
        messages += [Message(role="user", content=pair[0]),
                     Message(role="assistant", content=c, reasoning_content=r)]
    user = f"{instruction}\n\n{inp}" if inp else instruction
    r, c = split_reasoning(output)
    messages += [Message(role="user", content=user),
                 Message(role="assistant", content=c, reasoning_content=r)]
    extra = {k: v for k, v in obj.items()
             if k not in ("instruction", "input", "output", "system", "history", "id")}
    return ChatExample(messages=messages, id=obj.get("id"), metadata=extra or None)


def to_alpaca(ex: ChatExample) -> dict[str, Any]:
    msgs = list(ex.messages)
    out: dict[str, Any] = {}
    if ex.id is not None:
        out["id"] = ex.id
    if msgs[0].role == "system":
        out["system"] = msgs.pop(0).content
    if ex.tools or any(m.role == "tool" or m.tool_calls for m in msgs):
        raise RecordError("Alpaca cannot hold tools, tool calls or tool turns; export as "
                          "messages or sharegpt", "unsupported")
    roles = [m.role for m in msgs]
    if roles != ["user", "assistant"] * (len(msgs) // 2) or len(msgs) % 2:
        raise RecordError("Alpaca needs alternating user/assistant turns", "unsupported")
    pairs = [(msgs[i], msgs[i + 1]) for i in range(0, len(msgs), 2)]
    *hist, (u, a) = pairs
    out["instruction"] = u.content
    out["input"] = ""
    out["output"] = join_reasoning(a.reasoning_content, a.content or "")
    if hist:
        out["history"] = [[q.content, join_reasoning(r.reasoning_content, r.content or "")]
                          for q, r in hist]
    out.update(ex.metadata or {})
    return out


def from_messages(obj: Any) -> ChatExample:
    if not isinstance(obj, dict):
        raise RecordError("expected a JSON object", "wrong_type")
    return ChatExample.model_validate(obj)


def to_messages(ex: ChatExample) -> dict[str, Any]:
    return ex.to_json()


READERS = {"messages": from_messages, "sharegpt": from_sharegpt, "alpaca": from_alpaca}
WRITERS = {"messages": to_messages, "sharegpt": to_sharegpt, "alpaca": to_alpaca}


def parse_example(obj: Any, fmt: str = "auto") -> ChatExample:
    fmt = detect_format(obj) if fmt == "auto" else fmt
    if fmt not in READERS:
        raise RecordError(f"unknown format {fmt!r} (expected {', '.join(FORMATS)} or auto)",
                          "unknown_format")
    return READERS[fmt](obj)


def read_dataset(path: str | Path, fmt: str = "auto") -> list[ChatExample]:
    """Read a whole dataset file; the first bad line raises a DataError with its line."""
    out = []
    for lineno, obj in iter_jsonl_raw(path):
        try:
            out.append(parse_example(obj, fmt))
        except RecordError as e:
            raise DataError(str(e), path=str(path), line=lineno, code=e.code) from None
        except ValueError as e:
            raise DataError(describe_validation_error(e), path=str(path), line=lineno,
                            code=_error_code(e)) from None
    return out


def validate_dataset(path: str | Path, fmt: str = "auto") -> tuple[int, list[DataError]]:
    """Check every line; return (good count, every problem found) instead of stopping at one."""
    good, problems = 0, []
    for lineno, obj in iter_jsonl_raw(path, collect=True):
        if isinstance(obj, DataError):
            problems.append(obj)
            continue
        try:
            parse_example(obj, fmt)
            good += 1
        except RecordError as e:
            problems.append(DataError(str(e), path=str(path), line=lineno, code=e.code))
        except ValueError as e:
            problems.append(DataError(describe_validation_error(e), path=str(path),
                                      line=lineno, code=_error_code(e)))
    return good, problems


def write_dataset(path: str | Path, examples: Iterable[ChatExample], fmt: str = "messages") -> int:
    if fmt not in WRITERS:
        raise DataError(f"unknown format {fmt!r} (expected {', '.join(FORMATS)})")
    writer = WRITERS[fmt]
    rows = []
    for i, ex in enumerate(examples, start=1):
        try:
            rows.append(writer(ex))
        except RecordError as e:
            raise DataError(f"record {i}: {e}", path=str(path), code=e.code) from None
    return write_jsonl(path, rows)


# --- preference pairs -------------------------------------------------------------------------
# One format for every exporter (`records.PreferencePair`: prompt messages, chosen and rejected
# continuations, tools, provenance). TRL's conversational preference format is the same three
# lists; TRL writes tool-call arguments as objects and has no call ids, and its "implicit
# prompt" rows carry whole conversations in chosen/rejected with the prompt as their shared
# start.

def parse_preference(obj: Any) -> PreferencePair:
    """A pair in our format or TRL's (explicit or implicit prompt)."""
    if not isinstance(obj, dict):
        raise RecordError("expected a JSON object", "wrong_type")
    for k in ("chosen", "rejected"):
        if k not in obj:
            raise RecordError(f"{k}: missing field", "missing_field")
        if not isinstance(obj[k], list):
            raise RecordError(f"{k}: expected a list of messages (TRL's conversational "
                              f"format), got {type(obj[k]).__name__}", "wrong_type")
    return from_trl_preference(obj)


def from_trl_preference(obj: dict[str, Any]) -> PreferencePair:
    """TRL's conversational preference row (or ours) as a PreferencePair."""
    obj = dict(obj)
    if "prompt" not in obj:  # implicit prompt: the longest shared start of both sides
        c, r = obj["chosen"], obj["rejected"]
        n = 0
        while n < min(len(c), len(r)) - 1 and c[n] == r[n]:
            n += 1
        while n and (not isinstance(c[n - 1], dict) or c[n - 1].get("role") == "assistant"):
            n -= 1  # a side starts at an assistant turn
        obj["prompt"], obj["chosen"], obj["rejected"] = c[:n], c[n:], r[n:]
    ids: dict[int, str] = {}
    for key in ("prompt", "chosen", "rejected"):
        if not isinstance(obj.get(key), list):
            raise RecordError(f"{key}: expected a list of messages", "wrong_type")
        obj[key] = [_from_trl_message(m, f"{key}.{i}", ids) for i, m in enumerate(obj[key])]
    if obj.get("tools"):
        obj["tools"] = [t if isinstance(t, dict) and "function" in t
                        else {"type": "function", "function": t} for t in obj["tools"]]
    return PreferencePair.model_validate(obj)


def _from_trl_message(m: Any, where: str, ids: dict[int, str]) -> Any:
    if not isinstance(m, dict):
        return m  # the record's validation names it
    m = dict(m)
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        fixed = []
        for c in calls:
            if isinstance(c, dict) and isinstance(c.get("function"), dict):
                c = {**c, "type": c.get("type", "function"),
                     "id": c.get("id") or f"call_{len(ids)}"}
                ids[len(ids)] = c["id"]
                args = c["function"].get("arguments", "{}")
                if not isinstance(args, str):
                    c["function"] = {**c["function"],
                                     "arguments": json.dumps(args, ensure_ascii=False)}
            fixed.append(c)
        m["tool_calls"] = fixed
        m.setdefault("content", "")
    if m.get("role") == "tool" and not m.get("tool_call_id") and ids:
        m["tool_call_id"] = ids[max(ids)]  # TRL rows have no ids: the latest call
    return m


def to_trl_preference(pair: PreferencePair) -> dict[str, Any]:
    """TRL's conversational preference row: prompt/chosen/rejected message lists (tool-call
    arguments as objects where they are valid JSON), `tools` as JSON schemas."""
    def msg(m: Message) -> dict[str, Any]:
        d = m.to_json()
        for c in d.get("tool_calls", ()):
            try:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
            except ValueError:
                pass  # invalid JSON stays text: a rejected side may hold exactly that
        return d

    out: dict[str, Any] = {k: [msg(m) for m in getattr(pair, k)]
                           for k in ("prompt", "chosen", "rejected")}
    if pair.tools:
        out["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in pair.tools]
    return out


def read_preferences(path: str | Path) -> list[PreferencePair]:
    """Every pair of a JSONL file; the first bad line raises a DataError naming it."""
    _, problems, pairs = _scan_preferences(path, stop_at_first=True)
    if problems:
        raise problems[0]
    return pairs


def validate_preferences(path: str | Path) -> tuple[int, list[DataError]]:
    """(good count, every problem) for a preference JSONL file."""
    good, problems, _ = _scan_preferences(path, stop_at_first=False)
    return good, problems


def _scan_preferences(path, *, stop_at_first: bool):
    pairs, problems = [], []
    for lineno, obj in iter_jsonl_raw(path, collect=not stop_at_first):
        if isinstance(obj, DataError):
            problems.append(obj)
            continue
        try:
            pairs.append(parse_preference(obj))
        except RecordError as e:
            problems.append(DataError(str(e), path=str(path), line=lineno, code=e.code))
        except ValueError as e:
            problems.append(DataError(describe_validation_error(e), path=str(path),
                                      line=lineno, code=_error_code(e)))
        if problems and stop_at_first:
            break
    if not pairs and not problems:
        problems.append(DataError("no preference pairs in the file", path=str(path),
                                  code="empty"))
    return len(pairs), problems, pairs


def is_preference_row(obj: Any) -> bool:
    return isinstance(obj, dict) and "chosen" in obj and "rejected" in obj

def format_options(options: Sequence[str]) -> str:
    """`A) first` lines, one per option."""
    return "\n".join(f"{LETTERS[i]}) {o}" for i, o in enumerate(options))


# --- a QTSA sample as a chat example (distill's SFT export, federated sites' rows)

STYLES = ("instruct", "thinking")


def question_text(s: QTSASample) -> str:
    if s.kind == "mc":
        assert s.options is not None  # an MC sample has its four (QTSASample checks)
        return f"{s.question}\n{format_options(s.options)}\nAnswer with the letter of the " \
               "correct option."
    return s.question


def _lead(s: QTSASample) -> str:
    """An MC reply's first line: the letter and its option ("B) ..."), so the letter is the
    reply's first token, the one the letter scoring reads (and what the answer parser reads
    first). Open answers have none."""
    if s.kind != "mc" or not s.options or len(s.answer) != 1:
        return ""
    return f"{s.answer}) {s.options[LETTERS.index(s.answer)]}\n\n"


def to_chat(s: QTSASample, style: str = "instruct") -> ChatExample:
    lead = _lead(s)
    # composed mode's solution only restates the option the lead line already gives
    restated = lead and s.solution.startswith("The correct option is ")
    final = f"<answer>{s.answer}</answer>" if restated else \
        f"{s.solution}\n\n<answer>{s.answer}</answer>"
    if style == "instruct":
        body = f"{s.thinking}\n\n{final}" if s.thinking else final
        reply = Message(role="assistant", content=f"{lead}{body}")
    elif style == "thinking":
        reply = Message(role="assistant", content=f"{lead}{final}",
                        reasoning_content=s.thinking)
    else:
        raise ValueError(f"style must be one of {', '.join(STYLES)}")
    return ChatExample(id=s.id, messages=[Message(role="user", content=question_text(s)),
                                          reply],
                       metadata={"kind": s.kind, "section_id": s.provenance.section_id})
