"""The prompt side of a backend that has a Hugging Face tokenizer: chat-template rendering
(tools included), lm-eval's context/continuation encoding, tokenize and detokenize.

The transformers and CTranslate2 backends both subclass `TokenizerChatModel`, so the same
conversation becomes the same prompt text and the same tokens on either.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from workbench.errors import BackendError, WorkbenchError
from workbench.models.base import ChatModel, Conversation, Tools
from workbench.models.messages import ToolChoice, ToolSpec, plain_conversation
from workbench.models.resolve import ModelSource
from workbench.models.tools import TemplateTools, forced_prefix, template_messages

log = logging.getLogger(__name__)


class TokenizerChatModel(ChatModel):
    """A chat model whose prompts come from `self.tokenizer` and its chat template. A
    subclass sets `tokenizer`, `source` and `_tool_notice = False` when it loads."""

    tokenizer: Any
    source: ModelSource
    _tool_notice: bool

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    @property
    def template_tools(self) -> TemplateTools:
        """How this model's chat template takes tools (read from the template each time:
        the template may be replaced after loading)."""
        return TemplateTools.of(self.chat_template)

    def render(self, conversation: Conversation, tools: Tools | None = None,
               tool_choice: ToolChoice | None = None) -> str:
        """The prompt text for a conversation, ending with the assistant header (and, when
        `tool_choice` forces a call, the start of that call)."""
        specs, choice = self._tool_request(tools, tool_choice)
        return self._prompt(conversation, specs, choice)[0]

    def _prompt(self, conversation: Conversation, tools: list[ToolSpec] | None,
                choice: ToolChoice, *, add_generation_prompt: bool = True) -> tuple[str, str]:
        """(prompt text, forced prefix it ends with). tool_choice "none" offers no tools."""
        tpl = self.chat_template
        if not tpl:
            raise WorkbenchError(f"{self.source.name} has no chat template; pass the "
                                 "`chat_template` option")
        how = self.template_tools
        offered = tools if choice != "none" else None
        if offered:
            self._notice_tools(how)
        msgs = template_messages(plain_conversation(conversation), how, offered, choice)
        kw: dict[str, Any] = {}
        if offered and how.native:
            kw["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in offered]
        text = self.tokenizer.apply_chat_template(
            msgs, add_generation_prompt=add_generation_prompt, tokenize=False, **kw)
        prefix = forced_prefix(how, choice, tpl) if offered and add_generation_prompt else ""
        return text + prefix, prefix

    def _notice_tools(self, how: TemplateTools) -> None:
        if self._tool_notice:
            return
        self._tool_notice = True
        if not how.native:
            log.warning("%s: the chat template takes no tools; describing them in the system "
                        "prompt and parsing <tool_call> blocks", self.source.name)
        elif not how.known_family:
            log.warning("%s: the chat template takes tools in a syntax not recognised; "
                        "parsing <tool_call> blocks", self.source.name)

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        # lm-evaluation-harness's convention: trailing spaces of the context move into the
        # continuation, and the continuation's tokens are the tail of the joint encoding.
        n_space = len(context) - len(context.rstrip())
        if n_space:
            continuation = context[-n_space:] + continuation
            context = context[:-n_space]
        whole = self.tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
        ctx = self.tokenizer(context, add_special_tokens=False)["input_ids"]
        return ctx, whole[len(ctx):]

    def tokenize(self, prompt: str | Conversation, *, add_special_tokens: bool | None = None,
                 add_generation_prompt: bool = True, tools: Tools | None = None) -> list[int]:
        if isinstance(prompt, str):
            text = prompt
            add = True if add_special_tokens is None else add_special_tokens
        else:
            specs, choice = self._tool_request(tools, None)
            text = self._prompt(prompt, specs, choice,
                                add_generation_prompt=add_generation_prompt)[0]
            add = bool(add_special_tokens)
        return self.tokenizer(text, add_special_tokens=add)["input_ids"]

    def detokenize(self, ids: Sequence[int]) -> str:
        size = len(self.tokenizer)
        if bad := [i for i in ids if not 0 <= i < size]:
            raise WorkbenchError(f"token ids must be in 0..{size - 1}; got {bad[0]}")
        return self.tokenizer.decode(list(ids))

    def _flat_pairs(self, requests, start_id: int) -> list[tuple[int, list[int], list[int], int]]:
        """(request index, context ids, continuation ids, continuation length) for every
        continuation of every scoring request; an empty context scores from `start_id`
        (the BOS or EOS token, as lm-eval does)."""
        flat: list[tuple[int, list[int], list[int], int]] = []
        for ri, req in enumerate(requests):
            prompt = req.prompt if isinstance(req.prompt, str) else self.render(req.prompt)
            for cont in req.continuations:
                ctx, cont_ids = self._encode_pair(prompt, cont)
                if not cont_ids:
                    raise BackendError(f"continuation {cont!r} encodes to no tokens")
                flat.append((ri, ctx or [start_id], cont_ids, len(cont)))
        return flat
