"""Continuation scoring on a transformers model (lm-eval's log-likelihoods), with the
key/value cache shared: a prompt is run once for all its continuations, and a prefix that
several prompts share (an agent's system prompt, a benchmark's instructions) once per call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from workbench.models.base import ContinuationScore, ScoreRequest
from workbench.progress import progress


class CachedScoring:
    """`score` of `LocalChatModel`, on its `model`, `tokenizer`, `device`, `_lock` and
    `opts.batch_size` (and its `render` and `_encode_pair`)."""

    model: Any
    tokenizer: Any
    device: str
    opts: Any
    _lock: threading.Lock
    # the host's (`hf_chat.TokenizerChatModel`)
    render: Callable[..., str]
    _encode_pair: Callable[[str, str], tuple[list[int], list[int]]]
    _flat_pairs: Callable[[Sequence[ScoreRequest], int],
                          list[tuple[int, list[int], list[int], int]]]

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[ContinuationScore]]:
        """Log-likelihood of each continuation after its prompt (lm-eval's conventions).

        The continuations of one request share its prompt: the prompt is run once and its
        key/value cache is reused for every continuation (a 4-option item costs about one
        prompt pass instead of four). Requests whose prompts start alike (an agent's system
        prompt and tool descriptions, a benchmark's instructions) share that prefix too: it
        is run once per call and its cache copied for each request."""
        out: list[list[ContinuationScore] | None] = [None] * len(requests)
        rest = []
        shared: list[tuple[int, list[int], list[list[int]]]] = []
        for ri, req in enumerate(requests):
            prompt = req.prompt if isinstance(req.prompt, str) else self.render(req.prompt)
            pairs = [self._encode_pair(prompt, c) for c in req.continuations]
            ctx = pairs[0][0] if pairs else []
            if len(pairs) > 1 and ctx and all(p[0] == ctx and p[1] for p in pairs):
                shared.append((ri, ctx, [p[1] for p in pairs]))
            else:
                rest.append(ri)
        prefix = self._common_prefix([ctx for _, ctx, _ in shared])
        for ri, ctx, conts in progress(shared, desc="scoring", unit="prompt", delay=2):
            out[ri] = self._score_shared(ctx, conts,
                                         [len(c) for c in requests[ri].continuations], prefix)
        if rest:
            for ri, row in zip(rest, self._score_batched([requests[i] for i in rest]),
                               strict=True):
                out[ri] = row
        return out  # type: ignore[return-value]

    @property
    def _cache_kwarg(self) -> str:
        """transformers 5 renamed `past_key_values` to `cache`; accept both."""
        import inspect

        model = self.model  # a PEFT wrapper takes **kwargs: ask the model it wraps
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(type(base).forward).parameters
        return "cache" if "cache" in params else "past_key_values"

    PREFIX_MIN = 48  # tokens: a shorter common prefix is not worth a cache copy per request

    def _common_prefix(self, ctxs: list[list[int]]) -> tuple[int, Any] | None:
        """(length, key/value cache) of the prompt prefix all `ctxs` share, run once; None
        when fewer than two prompts share at least PREFIX_MIN tokens."""
        import torch

        if len(ctxs) < 2:
            return None
        n = min(len(c) for c in ctxs) - 1  # each prompt keeps a token of its own
        first = ctxs[0]
        for c in ctxs[1:]:
            k = 0
            while k < n and c[k] == first[k]:
                k += 1
            n = k
        if n < self.PREFIX_MIN:
            return None
        with self._lock, torch.inference_mode():
            run = self.model(input_ids=torch.tensor([first[:n]], device=self.device),
                             use_cache=True, logits_to_keep=1)
        return n, getattr(run, "cache", None) or run.past_key_values

    def _score_shared(self, ctx: list[int], conts: list[list[int]], nchars: list[int],
                      prefix: tuple[int, Any] | None = None) -> list[ContinuationScore]:
        """Score continuations after one context. Tokens all continuations start with (a tool
        call's `{"name": "answer", "arguments": {"label": "`) are run once with the context
        and their log-probability is added to each continuation's."""
        import copy

        import torch

        lcp = 0
        while lcp < min(len(c) for c in conts) - 1 and len({c[lcp] for c in conts}) == 1:
            lcp += 1
        common, conts = conts[0][:lcp], [c[lcp:] for c in conts]
        n, width = len(conts), max(len(c) for c in conts)
        with self._lock, torch.inference_mode():
            if prefix is not None:
                plen, pcache = prefix
                run = ctx[plen:] + common
                first = self.model(input_ids=torch.tensor([run], device=self.device),
                                   position_ids=torch.arange(plen, plen + len(run),
                                                             device=self.device)[None],
                                   use_cache=True, logits_to_keep=lcp + 1,
                                   **{self._cache_kwarg: copy.deepcopy(pcache)})
            else:
                first = self.model(input_ids=torch.tensor([ctx + common], device=self.device),
                                   use_cache=True, logits_to_keep=lcp + 1)
            rows = torch.log_softmax(first.logits[0].float(), dim=-1).cpu()
            head = rows[-1]
            shared_lp = sum(rows[k, t].item() for k, t in enumerate(common))
            shared_greedy = all(int(rows[k].argmax()) == t for k, t in enumerate(common))
            ctx = ctx + common
            tail = None
            if width > 1:
                cache = getattr(first, "cache", None) or first.past_key_values
                cache.batch_repeat_interleave(n)
                pad = self.tokenizer.pad_token_id
                ids = torch.full((n, width - 1), pad, dtype=torch.long)
                mask = torch.zeros((n, len(ctx) + width - 1), dtype=torch.long)
                mask[:, :len(ctx)] = 1
                for j, c in enumerate(conts):
                    ids[j, :len(c) - 1] = torch.tensor(c[:-1], dtype=torch.long)
                    mask[j, len(ctx):len(ctx) + len(c) - 1] = 1
                pos = torch.arange(len(ctx), len(ctx) + width - 1).expand(n, -1)
                logits = self.model(input_ids=ids.to(self.device),
                                    attention_mask=mask.to(self.device),
                                    position_ids=pos.to(self.device), use_cache=True,
                                    **{self._cache_kwarg: cache}).logits
                tail = torch.log_softmax(logits.float(), dim=-1).cpu()
        out = []
        for j, c in enumerate(conts):
            total = shared_lp + head[c[0]].item()
            greedy = shared_greedy and int(head.argmax()) == c[0]
            for k in range(1, len(c)):
                assert tail is not None  # set whenever a continuation is over one token
                row = tail[j, k - 1]
                total += row[c[k]].item()
                greedy = greedy and int(row.argmax()) == c[k]
            out.append(ContinuationScore(logprob=total, n_tokens=lcp + len(c),
                                         n_chars=nchars[j], is_greedy=greedy))
        return out

    def _score_batched(self, requests: Sequence[ScoreRequest]) -> list[list[ContinuationScore]]:
        import torch

        flat = self._flat_pairs(requests,
                                self.tokenizer.bos_token_id or self.tokenizer.eos_token_id)
        results: list[ContinuationScore] = []
        bs = self.opts.batch_size
        pad = self.tokenizer.pad_token_id
        # Left padding puts every continuation at the end of its row, so only the last K
        # positions need logits (`logits_to_keep`): the vocabulary projection and softmax
        # over the whole prompt would cost more than the rest of the forward pass.
        for i in progress(range(0, len(flat), bs), desc="scoring", unit="batch", delay=2):
            chunk = flat[i:i + bs]
            seqs = [(ctx + cont)[:-1] for _, ctx, cont, _ in chunk]
            width = max(len(s) for s in seqs)
            keep = max(len(cont) for _, _, cont, _ in chunk)
            ids = torch.full((len(seqs), width), pad, dtype=torch.long)
            mask = torch.zeros((len(seqs), width), dtype=torch.long)
            for j, sq in enumerate(seqs):
                ids[j, width - len(sq):] = torch.tensor(sq)
                mask[j, width - len(sq):] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            with self._lock, torch.inference_mode():
                logits = self.model(input_ids=ids.to(self.device),
                                    attention_mask=mask.to(self.device),
                                    position_ids=pos.to(self.device),
                                    logits_to_keep=keep).logits
            logprobs = torch.log_softmax(logits.float(), dim=-1).cpu()
            for j, (_, ctx, cont, nchar) in enumerate(chunk):
                lp = logprobs[j, keep - len(cont):]
                target = torch.tensor(cont)
                total = lp.gather(1, target[:, None]).sum().item()
                greedy = bool((lp.argmax(-1) == target).all())
                results.append(ContinuationScore(logprob=total, n_tokens=len(cont),
                                                 n_chars=nchar, is_greedy=greedy))
        grouped: list[list[ContinuationScore]] = [[] for _ in requests]
        for (ri, *_), res in zip(flat, results, strict=True):
            grouped[ri].append(res)
        return grouped
