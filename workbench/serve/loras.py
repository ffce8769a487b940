"""Runtime LoRA adapters, vLLM's API: `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`
puts a PEFT adapter folder on the served base model under a name, `POST
/v1/unload_lora_adapter {"lora_name"}` takes it off, and a request whose `model` is that
name is answered with the adapter on (chat, completions, scoring); `/v1/models` lists the
adapters beside the base (`parent`, `root` as vLLM's, and the adapter file's sha256).

Only with `ServerLimits.lora_dir` (`workbench serve --lora-dir DIR`): a `lora_path` must
resolve (links followed) inside that folder, hold `adapter_config.json` and
`adapter_model.safetensors` (a pickle is refused) and fit the served model; names are
`[A-Za-z0-9][A-Za-z0-9._-]{0,63}`, never the base's; at most `max_loras` at once. Every
refusal is a 4xx with one line naming why; the API key guards these routes as every other.

Engines: the transformers backend only. The adapters live in one PEFT model over the served
weights; a call for a name turns that adapter on (and the base's state back afterwards)
under the model's own lock, made re-entrant, so a call never sees another's adapter. A
streamed reply from an adapter comes whole as one chunk (the stream's generating thread
would run outside the switch). llama.cpp and CTranslate2 refuse with a 400: their adapters
are fixed when the engine starts (`workbench serve --adapter`, converted to GGUF for
llama.cpp), and nothing here swaps them at runtime.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from workbench.errors import WorkbenchError
from workbench.io import sha256_file
from workbench.models.base import (
    ChatModel,
    ContinuationScore,
    Conversation,
    Generation,
    GenerationParams,
    ScoreRequest,
    TokenLogprobs,
    Tools,
)
from workbench.models.local import LocalChatModel, check_adapter_dir
from workbench.models.messages import ToolChoice
from workbench.records import StrictModel
from workbench.serve.replies import ApiError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
T = TypeVar("T")


class LoadLoraRequest(StrictModel):
    lora_name: str
    lora_path: str


class UnloadLoraRequest(StrictModel):
    lora_name: str


def unsupported(model: ChatModel) -> str | None:
    """Why runtime adapters cannot be put on `model` (None: they can)."""
    if not isinstance(model, LocalChatModel):
        return (f"runtime LoRA adapters need the transformers backend; this server runs "
                f"{model.backend_name!r}, whose adapters are fixed when it starts (restart "
                "it with --backend transformers, or with --adapter for one fixed adapter)")
    if getattr(model.opts, "merge_adapter", False):
        return "the served model's adapter is merged into its weights: runtime adapters " \
               "need it unmerged"
    return None


class LoraSet:
    """The adapters loaded on one served transformers model, by name."""

    def __init__(self, model: ChatModel, root: Path, max_loras: int, served_name: str):
        self.inner: Any = cast(Any, model)  # a LocalChatModel (`unsupported` said so)
        self.served_name = served_name  # no adapter may take the base's name
        self.root = root.resolve()
        self.max_loras = max_loras
        self.views: dict[str, LoraView] = {}
        self.base_adapter: str | None = None  # the served --adapter's name, if unmerged
        lock: Any = threading.RLock()  # the model's own lock, now re-entrant: the switch
        self.inner._lock = lock          # and the call under it hold it together
        self._peft: Any = None

    @property
    def lock(self) -> Any:
        return self.inner._lock

    # --- loading -------------------------------------------------------------------------

    def folder(self, lora_path: str) -> Path:
        """The adapter folder `lora_path` names, inside `root` (a relative path is read
        from `root`), or ApiError 400 naming why not."""
        raw = Path(lora_path)
        path = raw if raw.is_absolute() else self.root / raw
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            raise ApiError(400, f"lora_path {lora_path!r}: no such folder", "lora_path") \
                from None
        if not real.is_relative_to(self.root) or real == self.root:
            raise ApiError(403, f"lora_path {lora_path!r} is outside the folder this server "
                                "reads adapters from (--lora-dir)", "lora_path",
                           kind="permission_error")
        if not real.is_dir():
            raise ApiError(400, f"lora_path {lora_path!r} is not a folder", "lora_path")
        try:
            check_adapter_dir(real)
            _check_config(real)
        except WorkbenchError as e:
            raise ApiError(400, f"lora_path {lora_path!r}: {_relative(e, real, lora_path)}",
                           "lora_path") from None
        return real

    def load(self, name: str, lora_path: str) -> dict[str, Any]:
        check_name(name, self.served_name)
        if name in self.views:
            raise ApiError(400, f"the LoRA adapter {name!r} is already loaded; unload it "
                                "first or load under another name", "lora_name")
        if len(self.views) >= self.max_loras:
            raise ApiError(400, f"{len(self.views)} LoRA adapters are loaded, this server's "
                                f"limit (--max-loras); unload one first", "lora_name")
        folder = self.folder(lora_path)
        digest = sha256_file(folder / "adapter_model.safetensors")
        with self.lock, warnings.catch_warnings():
            # PEFT asks transformers a deprecated question while it wraps the model
            warnings.filterwarnings("ignore", ".*is_gradient_checkpointing.*", FutureWarning)
            try:
                self._attach(name, folder)
            except Exception as e:  # noqa: BLE001 - PEFT's and torch's errors: a bad adapter
                self._drop(name)
                raise ApiError(400, f"lora_path {lora_path!r} does not fit the served "
                                    f"model: {_first_line(e)}", "lora_path") from None
            finally:
                self._rest()
        self.views[name] = LoraView(self, name, str(folder), digest)
        return self.views[name].describe()

    def _attach(self, name: str, folder: Path) -> None:
        from peft import PeftConfig, PeftModel

        if self._peft is None:
            model = self.inner.model
            if isinstance(model, PeftModel):  # served with an unmerged --adapter
                self.base_adapter = model.active_adapter
                self._peft = model
            else:  # the layers first, then the weights: a failure can take them off again
                self._peft = PeftModel(model, PeftConfig.from_pretrained(str(folder)),
                                       adapter_name=name)
                self.inner.model = self._peft
        self._peft.load_adapter(str(folder), adapter_name=name)
        self._peft.to(self.inner.device).eval()

    def _drop(self, name: str) -> None:
        peft = self._peft
        if peft is not None and name in getattr(peft, "peft_config", {}):
            if len(peft.peft_config) == 1:  # the last one: the plain model again
                self.inner.model = peft.unload()
                self._peft = None
            else:  # another made active first: PEFT warns when the active one goes
                peft.set_adapter(next(n for n in peft.peft_config if n != name))
                peft.delete_adapter(name)

    def unload(self, name: str) -> dict[str, Any]:
        if name not in self.views:
            raise ApiError(404, f"the LoRA adapter {name!r} is not loaded", "lora_name",
                           kind="not_found_error")
        with self.lock:
            self.views.pop(name)
            self._drop(name)
            self._rest()
        return {"lora_name": name, "status": "unloaded"}

    # --- switching -----------------------------------------------------------------------

    def _rest(self) -> None:
        """The state between calls: the base model as served (adapters off, or the served
        --adapter on)."""
        peft = self._peft
        if peft is None:
            return
        if self.base_adapter is not None:
            peft.base_model.enable_adapter_layers()
            peft.set_adapter(self.base_adapter)
        else:
            peft.base_model.disable_adapter_layers()

    def run(self, name: str, fn: Callable[[], T]) -> T:
        with self.lock:
            if name not in self.views:  # unloaded while the request waited
                raise ApiError(404, f"the LoRA adapter {name!r} was unloaded", "model",
                               kind="not_found_error")
            peft = self._peft
            peft.base_model.enable_adapter_layers()
            peft.set_adapter(name)
            try:
                return fn()
            finally:
                self._rest()

    def listed(self, parent: str, created: int) -> list[dict[str, Any]]:
        return [{"id": v.name, "object": "model", "created": created, "owned_by": "workbench",
                 "parent": parent, "root": v.folder, "sha256": v.digest}
                for v in self.views.values()]


def check_name(name: str, served: str) -> None:
    if not NAME.fullmatch(name):
        raise ApiError(400, f"lora_name {name[:80]!r}: use 1 to 64 of A-Z, a-z, 0-9, '.', "
                            "'_', '-', starting with a letter or digit", "lora_name")
    if name == served:
        raise ApiError(400, f"lora_name {name!r} is the served base model's name", "lora_name")


def _check_config(folder: Path) -> None:
    import json

    try:
        cfg = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise WorkbenchError(f"adapter_config.json cannot be read ({e})") from None
    kind = cfg.get("peft_type") if isinstance(cfg, dict) else None
    if kind != "LORA":
        raise WorkbenchError(f"adapter_config.json: peft_type is {kind!r}, not 'LORA'")


def _relative(e: Exception, real: Path, given: str) -> str:
    return str(e).replace(f"{real}: ", "").replace(str(real), given)


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


class LoraView(ChatModel):
    """The served model with one adapter on, as a chat model: each call runs under the
    switch (`LoraSet.run`). Streaming comes whole (the base class's)."""

    def __init__(self, loras: LoraSet, name: str, folder: str, digest: str):
        self.loras, self.name, self.folder, self.digest = loras, name, folder, digest
        inner = loras.inner
        self.backend_name = inner.backend_name
        self.capabilities = inner.capabilities

    def describe(self) -> dict[str, Any]:
        return {"lora_name": self.name, "lora_path": self.folder, "sha256": self.digest,
                "status": "loaded"}

    @property
    def identity(self) -> str:
        return f"{self.loras.inner.identity}+lora:{self.digest[:16]}"

    @property
    def max_positions(self) -> int | None:
        return self.loras.inner.max_positions

    @property
    def chat_template(self) -> str | None:
        return self.loras.inner.chat_template

    @property
    def batch_size(self) -> int:
        return self.loras.inner.batch_size

    def generate(self, conversations: Sequence[Conversation],
                 params: GenerationParams | None = None, tools: Tools | None = None,
                 tool_choice: ToolChoice | None = None) -> list[Generation]:
        inner = self.loras.inner
        return self.loras.run(self.name, lambda: inner.generate(
            conversations, params, tools=tools, tool_choice=tool_choice))

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[ContinuationScore]]:
        return self.loras.run(self.name, lambda: self.loras.inner.score(requests))

    def token_logprobs(self, text: str, top: int = 0) -> TokenLogprobs:
        return self.loras.run(self.name, lambda: self.loras.inner.token_logprobs(text, top))

    def complete(self, prompts: Sequence[str],
                 params: GenerationParams | None = None) -> list[Generation]:
        return self.loras.run(self.name, lambda: self.loras.inner.complete(prompts, params))

    def check_constraint(self, constraint) -> None:
        self.loras.inner.check_constraint(constraint)

    def tokenize(self, prompt, *, add_special_tokens: bool | None = None,
                 add_generation_prompt: bool = True, tools: Tools | None = None) -> list[int]:
        return self.loras.inner.tokenize(prompt, add_special_tokens=add_special_tokens,
                                         add_generation_prompt=add_generation_prompt,
                                         tools=tools)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.loras.inner.detokenize(ids)

