"""GRPO's rollouts on an OpenAI-compatible server (`train.grpo.rollout_server`): the adapter
being trained is published to the server, which generates with it; the trainer keeps the
loss (its log-probs are computed here, in process, as without a server).

    server = RolloutServer(settings, folder, tokenizer)
    model = server.model_for(peft_model, step)  # publishes the adapter if it changed
    groups = sample_groups(model, tasks, setup, ...)   # requests say model=<its name>
    server.close()                              # the last adapter unloaded

Publishing: the adapter's tensors are hashed; when they differ from the published ones
(after each step's update, on a resume, or a starting `init_adapter`), the adapter is
written as a PEFT folder (`adapter_config.json`, `adapter_model.safetensors`) under
`<folder>/<prefix>-s<step>-<hash>/`, atomically (written beside it, then renamed), in a
folder the workbench made (it holds `workbench-published.json`); the server loads it by
that name and path (`POST /v1/load_lora_adapter`, vLLM's runtime LoRA API, which
`workbench serve --lora-dir` offers too), the previous one is unloaded and its folder
removed, and the next requests name the new one. The server must read the folder by the
same path (one machine, or a shared file system).

Tokens: the server answers with text (and tool calls), as the in-process engine's
generations are kept: a rollout is its conversation, and the trainer tokenises it with its
own tokenizer and chat template (`grpo.tokenize_rollout`) on either path. Those are the
sampled tokens wherever the tokenizer round-trips the text (the byte-level BPE models
here), provided the server renders the same template; that is checked once, before the
first rollout, by the server's `/tokenize` of a probe conversation (vLLM and `workbench
serve` answer it; a server without it is used unchecked, said once). A tool call comes back
parsed (`tool_calls`) and is rendered again by the template from its JSON, as in process:
where the model wrote it otherwise (spacing, key order) the trained tokens are the
template's. vLLM could return the sampled ids (`return_tokens_as_token_ids`, logprobs), but
the OpenAI-compatible backend and `workbench serve` carry text, so that is not used.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from workbench.agents.steps import AgentTrajectory
from workbench.errors import BackendError, WorkbenchError
from workbench.io import atomic_write_json, check_made_here, replace_dir
from workbench.models import load_model
from workbench.train.config import RolloutServerSettings

log = logging.getLogger(__name__)
MARKER = "workbench-published.json"
PROBE = [{"role": "system", "content": "You answer briefly."},
         {"role": "user", "content": "Is 12 x 12 = 144? Say yes or no."}]


def adapter_digest(model) -> str:
    """sha256 of the active adapter's tensors (names, dtypes, values)."""
    import torch
    from peft import get_peft_model_state_dict

    h = hashlib.sha256()
    for k, v in sorted(get_peft_model_state_dict(model, adapter_name=model.active_adapter)
                       .items()):
        t = v.detach().cpu().contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class RolloutServer:
    """One training's link to its rollout server: the client, the published adapter."""

    def __init__(self, settings: RolloutServerSettings, folder: str | Path | None,
                 tokenizer):
        self.settings, self.tokenizer = settings, tokenizer
        where = settings.publish_dir or folder
        if where is None:
            raise WorkbenchError("train.grpo.rollout_server: set publish_dir (a folder the "
                                 "server reads) or give the session a checkpoint folder")
        self.folder = Path(where)
        check_made_here(self.folder, (MARKER,))  # never a user's folder
        spec = settings.url + (f"#{settings.model}" if settings.model else "")
        self.client: Any = cast(Any, load_model(
            spec, backend="openai", api_key_env=settings.api_key_env or "",
            concurrency=settings.concurrency, timeout_s=settings.timeout_s,
            tokenizer="server"))
        self.base: str = self.client.model_name
        self.name: str | None = None  # the adapter loaded for the next rollouts
        self.digest: str | None = None
        self.published: list[dict[str, Any]] = []  # (step, name, seconds) per publish
        self._checked = False

    def model_for(self, model, step: int):
        """The server as a chat model whose requests name the adapter `model` carries now
        (published first when it is not yet)."""
        import time

        if not self._checked:
            self.check_template()
        digest = adapter_digest(model)
        if digest != self.digest:
            t0 = time.perf_counter()
            self.publish(model, f"{self.settings.lora_name}-s{step:06d}-{digest[:10]}",
                         digest)
            self.published.append({"step": step, "name": self.name,
                                   "seconds": time.perf_counter() - t0})
        return self.client

    def publish(self, model, name: str, digest: str) -> None:
        if not (self.folder / MARKER).is_file():
            check_made_here(self.folder, (MARKER,))
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.folder / MARKER, {"made_by": "workbench train grpo",
                                                     "server": self.settings.url})
        folder = self.folder / name
        if not (folder / "adapter_model.safetensors").is_file():
            tmp = self.folder / f".{name}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(tmp, safe_serialization=True)
            replace_dir(tmp, folder, ours=True)
        if name not in self.client.served_models():
            self.client.load_lora(name, str(folder.resolve()))
        old, self.name, self.digest = self.name, name, digest
        self.client.model_name = name
        if old is not None and old != name:
            self._retire(old)

    def _retire(self, name: str) -> None:
        try:
            self.client.unload_lora(name)
        except BackendError as e:  # the server keeps a stale adapter: said, not fatal
            log.warning("%s", e)
        shutil.rmtree(self.folder / name, ignore_errors=True)

    def check_template(self) -> None:
        """Refuse a server whose chat template renders a probe conversation into other
        tokens than the trainer's tokenizer does (the loss would train other tokens than
        the ones sampled)."""
        self._checked = True
        tok = self.tokenizer
        text = tok.apply_chat_template(PROBE, add_generation_prompt=True, tokenize=False)
        here = list(tok(text, add_special_tokens=False)["input_ids"])
        try:
            there = self.client.server_tokens(PROBE)
        except BackendError as e:
            log.warning("cannot check the rollout server's chat template (%s); its "
                        "rollouts are trained on as the trainer's template renders them",
                        str(e).splitlines()[0][:200])
            return
        if there != here:
            at = next((i for i, (a, b) in enumerate(zip(here, there, strict=False))
                       if a != b), min(len(here), len(there)))
            raise WorkbenchError(
                f"train.grpo.rollout_server: {self.settings.url} ({self.base}) renders a chat "
                f"prompt into other tokens than the trainer's tokenizer (they differ from "
                f"token {at}: {len(there)} tokens there, {len(here)} here); serve the "
                "trainer's base model with its own chat template")

    def check(self, runs: Sequence[AgentTrajectory]) -> None:
        """Refuse rollouts the server failed to make (a run stopped by a backend error is
        no sample of the policy: training on it would punish the policy for the server)."""
        for t in runs:
            if t.stop == "backend_error":
                why = next((st.error for st in t.steps if st.kind == "error"), "")
                raise WorkbenchError(f"train.grpo.rollout_server: rollout {t.task_id} "
                                     f"failed on the server ({self.client.model_name}): "
                                     f"{why}")

    def close(self) -> None:
        """Unload the last adapter from the server (its folder stays with the run)."""
        if self.name is not None:
            try:
                self.client.unload_lora(self.name)
            except BackendError as e:
                log.warning("%s", e)
            self.name = None
        self.client.close()
