"""Chat examples to training tensors: chat-template tokenisation with assistant-only labels,
and packing of short examples without cross-example attention.

Assistant spans are found by rendering the conversation piece by piece: the text up to each
assistant turn (ending with the generation prompt) and the text that turn adds are tokenised
separately and concatenated, so the boundary between "not trained" and "trained" tokens is
exact for any template that renders a conversation as a prefix of its continuation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import DataError, WorkbenchError
from workbench.formats import join_reasoning, read_dataset
from workbench.models.templates import template_fingerprint  # noqa: F401 (older imports)
from workbench.models.tools import TemplateTools, template_messages
from workbench.records import ChatExample
from workbench.runs import RunLayout, outputs_at

IGNORE = -100


@dataclass
class Tokenized:
    id: str
    input_ids: list[int]
    labels: list[int]

    @property
    def n_trained(self) -> int:
        return sum(lab != IGNORE for lab in self.labels)


def load_examples(cfg) -> tuple[Path, list[ChatExample]]:
    """The examples `train.data` names: a dataset file, or a distill run folder's SFT export."""
    if not cfg.data:
        raise WorkbenchError("train.data is not set: pass a dataset file or a distill run")
    path = Path(cfg.data)
    if path.is_dir():
        # distill's declared SFT export, in a run folder or in a distill folder itself
        for cand in (RunLayout.at(path).artifact("distill", "sft"),
                     outputs_at("distill", path).path("sft")):
            if cand.exists():
                path = cand
                break
        else:
            raise WorkbenchError(f"{cfg.data}: no SFT export found in this run folder")
    return path, read_dataset(path, cfg.data_format)


def _plain(ex: ChatExample, template: str | None = None) -> tuple[list[dict], list | None]:
    """Template-ready messages and the `tools=` argument. Reasoning stays in the target (a
    <think> block before the answer); tool calls and results are rendered the way the
    template renders them, or as text with the tools described in the system prompt when it
    takes no tools (`models.tools.template_messages`, the same as at inference)."""
    # an assistant turn's reasoning joins its content (none, for a turn of tool calls only)
    msgs = [{"role": m.role, "content": join_reasoning(m.reasoning_content, m.content or "")
             if m.role == "assistant" and m.reasoning_content is not None else m.content,
             **({"tool_calls": [tc.model_dump(mode="json") for tc in m.tool_calls]}
                if m.tool_calls else {}),
             **({"tool_call_id": m.tool_call_id} if m.tool_call_id else {}),
             **({"name": m.name} if m.name else {})} for m in ex.messages]
    if not ex.tools and not any(m.tool_calls or m.role == "tool" for m in ex.messages):
        return [{"role": m["role"], "content": m["content"]} for m in msgs], None

    how = TemplateTools.of(template)
    out = template_messages(msgs, how, ex.tools)
    tools = [t.model_dump(mode="json", exclude_none=True) for t in ex.tools] \
        if ex.tools and how.native else None
    return out, tools


def tokenize_example(tok, ex: ChatExample, idx: int = 0, *, skip_assistant: int = 0
                     ) -> Tokenized:
    """Token ids with labels on the assistant turns; the first `skip_assistant` assistant
    turns are context (not trained), as in a preference pair's prompt."""
    msgs, tools = _plain(ex, getattr(tok, "chat_template", None))
    extra = {"tools": tools} if tools else {}
    ids: list[int] = []
    labels: list[int] = []
    rendered = ""
    seen = 0
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        seen += 1
        prefix = tok.apply_chat_template(msgs[:i], add_generation_prompt=True, tokenize=False,
                                         **extra)
        full = tok.apply_chat_template(msgs[:i + 1], tokenize=False, **extra)
        if not prefix.startswith(rendered) or not full.startswith(prefix):
            raise WorkbenchError("the chat template does not render conversations as prefixes "
                                 "of their continuations; assistant-only masking needs that")
        context = prefix[len(rendered):]
        answer = full[len(prefix):]
        c_ids = tok(context, add_special_tokens=False)["input_ids"]
        a_ids = tok(answer, add_special_tokens=False)["input_ids"]
        ids += c_ids + a_ids
        labels += [IGNORE] * len(c_ids) + (a_ids if seen > skip_assistant
                                           else [IGNORE] * len(a_ids))
        rendered = full
    if tok.bos_token_id is not None and getattr(tok, "add_bos_token", False) and \
            (not ids or ids[0] != tok.bos_token_id):
        ids.insert(0, tok.bos_token_id)
        labels.insert(0, IGNORE)
    return Tokenized(ex.id or f"example-{idx}", ids, labels)


def check_can_tokenize(tok, rows: list, *, max_length: int, max_positions: int | None,
                       source: str, what: str = "dataset") -> None:
    """Refuse an empty dataset, a tokenizer without a chat template, or a max_length past the
    model's positions."""
    if not rows:
        raise DataError(f"the {what} is empty", path=source, code="empty")
    if not getattr(tok, "chat_template", None):
        raise WorkbenchError("the model has no chat template: pass train.chat_template")
    if max_positions is not None and max_length > max_positions:
        raise WorkbenchError(f"train.max_length {max_length} exceeds the model's "
                             f"{max_positions} positions")


def tokenize_all(tok, examples: list[ChatExample], *, max_length: int, max_positions: int | None,
                 source: str = "dataset") -> list[Tokenized]:
    """Tokenise everything first; refuse (before step 0) on anything training cannot use."""
    check_can_tokenize(tok, examples, max_length=max_length, max_positions=max_positions,
                       source=source)
    out = [tokenize_example(tok, ex, i) for i, ex in enumerate(examples)]
    for i, t in enumerate(out, start=1):
        if len(t.input_ids) > max_length:
            raise DataError(f"example {t.id} is {len(t.input_ids)} tokens, over train."
                            f"max_length={max_length} (raise it, up to the model's "
                            f"{max_positions} positions, or drop the example)", path=source,
                            line=i, code="too_long")
        if t.n_trained == 0:
            raise DataError(f"example {t.id} has no assistant tokens to train on", path=source,
                            line=i, code="no_assistant")
    return out


@dataclass
class Batch:
    input_ids: list[list[int]]
    labels: list[list[int]]
    position_ids: list[list[int]] | None  # packed: positions restart at each example
    attention_mask: list[list[int]] | None  # padded: 1 for real tokens
    n_real: int  # non-padding tokens
    n_trained: int  # tokens with a label


def pack(examples: list[Tokenized], max_length: int, pad_id: int
         ) -> list[tuple[list[int], list[int], list[int], int]]:
    """Greedy packing in order: each row holds whole examples up to max_length tokens.
    Returns rows of (input_ids, labels, position_ids); the tail is padding that forms its
    own segment (positions from 0) with ignored labels."""
    rows: list[tuple[list[int], list[int], list[int]]] = []
    cur_ids: list[int] = []
    cur_lab: list[int] = []
    cur_pos: list[int] = []
    for ex in examples:
        if cur_ids and len(cur_ids) + len(ex.input_ids) > max_length:
            rows.append((cur_ids, cur_lab, cur_pos))
            cur_ids, cur_lab, cur_pos = [], [], []
        cur_ids = cur_ids + ex.input_ids
        cur_lab = cur_lab + ex.labels
        cur_pos = cur_pos + list(range(len(ex.input_ids)))
    if cur_ids:
        rows.append((cur_ids, cur_lab, cur_pos))
    out = []
    for ids, lab, pos in rows:
        n = max_length - len(ids)
        out.append((ids + [pad_id] * n, lab + [IGNORE] * n, pos + list(range(n)), len(ids)))
    return out


def make_batches(examples: list[Tokenized], *, batch_size: int, max_length: int,
                 packing: bool, pad_id: int, seed: int, epoch: int) -> list[Batch]:
    """Batches of one epoch, in a seeded order that depends only on (seed, epoch)."""
    order = list(range(len(examples)))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    shuffled = [examples[i] for i in order]
    batches = []
    if packing:
        packed = pack(shuffled, max_length, pad_id)
        for i in range(0, len(packed), batch_size):
            rows = packed[i:i + batch_size]
            batches.append(Batch([r[0] for r in rows], [r[1] for r in rows],
                                 [r[2] for r in rows], None, sum(r[3] for r in rows),
                                 sum(sum(x != IGNORE for x in r[1]) for r in rows)))
        return batches
    for i in range(0, len(shuffled), batch_size):
        chunk = shuffled[i:i + batch_size]
        width = max(len(e.input_ids) for e in chunk)
        ids = [e.input_ids + [pad_id] * (width - len(e.input_ids)) for e in chunk]
        lab = [e.labels + [IGNORE] * (width - len(e.labels)) for e in chunk]
        mask = [[1] * len(e.input_ids) + [0] * (width - len(e.input_ids)) for e in chunk]
        batches.append(Batch(ids, lab, None, mask, sum(len(e.input_ids) for e in chunk),
                             sum(e.n_trained for e in chunk)))
    return batches


def to_tensors(b: Batch, device: str) -> dict:
    import torch

    out = {"input_ids": torch.tensor(b.input_ids, device=device),
           "labels": torch.tensor(b.labels, device=device)}
    if b.position_ids is not None:
        # no attention mask + restarting positions: transformers builds a block-diagonal
        # causal mask, so packed examples never attend to each other
        out["position_ids"] = torch.tensor(b.position_ids, device=device)
    else:
        out["attention_mask"] = torch.tensor(b.attention_mask, device=device)
    return out


def preview(tok, ex: ChatExample, mark: tuple[str, str] = ("[[", "]]"), *,
            skip_assistant: int = 0) -> str:
    """The rendered example with trained (assistant) spans wrapped in markers."""
    t = tokenize_example(tok, ex, skip_assistant=skip_assistant)
    out, inside = [], False
    for tid, lab in zip(t.input_ids, t.labels, strict=True):
        trained = lab != IGNORE
        if trained and not inside:
            out.append(mark[0])
        if not trained and inside:
            out.append(mark[1])
        inside = trained
        out.append(tok.decode([tid]))
    if inside:
        out.append(mark[1])
    return "".join(out)
