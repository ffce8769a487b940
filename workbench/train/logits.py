"""The next-token logits the training losses need, only where they are needed: a model's
decoder and output embedding, and the summed next-token loss over the labelled positions.
A leaf that `step` (which re-exports both), `evals` and `preference` share."""

from __future__ import annotations


def summed_loss(model, inputs: dict, labels):
    """Sum of next-token cross-entropy over the labelled (assistant) positions.

    Where the model exposes its decoder and output embedding (Llama, Qwen, Mistral, Gemma,
    ...), the vocabulary projection runs only on the positions that have a label: the
    prompt's positions never need logits, and the full (batch x length x vocabulary) logits
    tensor, its shifted copy and its softmax are never materialised.
    """
    import torch

    parts = decoder_and_head(model)
    if parts is None:  # generic path, and under DDP, whose own forward must run to sync
        logits = model(**inputs, use_cache=False).logits.float()
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
            ignore_index=-100, reduction="sum")
    decoder, head = parts
    hidden = decoder(**inputs, use_cache=False).last_hidden_state
    target = labels[:, 1:]
    keep = target != -100
    logits = head(hidden[:, :-1][keep]).float()
    return torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum")


def decoder_and_head(model):
    """(decoder, output embedding) of a model whose logits are the head applied to the
    decoder's last hidden state (Llama, Qwen, Mistral, Gemma, ...), so logits can be computed
    only at the positions that have a label; None under DDP (whose own forward must run) or
    when the model scales or caps its logits."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return None
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = getattr(inner, "get_decoder", lambda: None)()
    head = inner.get_output_embeddings()
    cfg = inner.config
    if decoder is None or head is None or getattr(cfg, "final_logit_softcapping", None) \
            or getattr(cfg, "logit_scale", None) is not None:
        return None
    return decoder, head
