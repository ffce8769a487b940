"""One registry for every backend. Backends are entries of the entry-point group
`workbench.backends` (`workbench.plugins`; the built-ins are the workbench's own entries),
each naming a `ChatModel` class, imported on first use so that `import workbench.models` does
not pull torch; `@register_backend(name)` registers one from code (tests, notebooks). The
table is a `workbench.plugins.Registry`, the one registry type."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workbench import plugins
from workbench.models.base import ChatModel
from workbench.models.llamacpp_server import fallback_reason
from workbench.models.resolve import resolve_chat_model

# registered from code, or the group's entries loaded on first use; the aliases are other
# names a config may use: `-s models.chat.backend=transformers|ctranslate2|llama.cpp`
BACKENDS: plugins.Registry[Callable[..., ChatModel]] = plugins.Registry(
    "model backend", group=plugins.BACKENDS, sort=True,
    aliases={"transformers": "local", "ct2": "ctranslate2", "llama.cpp": "llamacpp",
             "llama_cpp": "llamacpp"},
    unknown="unknown {kind} {name!r}; available: {known}")


def register_backend(name: str):
    """Class decorator: `@register_backend("mybackend")` makes `backend: mybackend` loadable."""

    def deco(cls):
        cls.backend_name = name
        BACKENDS.register(name, cls)
        return cls

    return deco


def _backend(name: str) -> Callable[..., ChatModel]:
    return BACKENDS.get(name)


def available_backends() -> list[str]:
    return BACKENDS.known()


_FALLBACK_SAID: set[str] = set()


def default_backend(kind: str, *, say: bool = False) -> str:
    """The backend a model source of this kind gets when none is named: an OpenAI-compatible
    server's own; llama.cpp for a GGUF file (the bundled model included), where it is
    installed and this machine has no GPU it cannot use; transformers otherwise. With `say`,
    a GGUF that falls back to transformers is logged once, with the reason."""
    if kind == "openai":
        return "openai"
    if kind not in ("bundled-gguf", "gguf"):
        return "local"
    why = fallback_reason()
    if why is None:
        return "llamacpp"
    if say and why not in _FALLBACK_SAID:
        _FALLBACK_SAID.add(why)
        import logging

        logging.getLogger("workbench.models").warning(
            "generation runs on transformers, not llama.cpp: %s", why)
    return "local"


def backend_uses(spec: str = "default", backend: str | None = None,
                 options: dict[str, Any] | None = None) -> dict[str, str]:
    """Which backend serves each use of a spec ({"generate": ..., "score": ...}), without
    loading it; the transformers backend is called "transformers" here."""
    if backend == "fake" or spec.startswith("fake"):
        name = "fake"
    else:
        name = backend or default_backend(resolve_chat_model(spec).kind)
    uses = getattr(_backend(name), "uses", None)
    if uses is not None:
        return uses(options)
    name = BACKENDS.canonical(name)
    shown = "transformers" if name == "local" else name
    return {"generate": shown, "score": shown}


def load_model(spec: str = "default", *, backend: str | None = None,
               **options: Any) -> ChatModel:
    """Resolve a model spec and build its backend.

    `spec` is a bundled short name, a local HF folder, a .gguf file, a hub id already in the
    local HF cache, or the URL of an OpenAI-compatible server (optionally `URL#model`).
    `backend` overrides the choice (e.g. "fake" for tests). `options` go to the backend,
    which rejects unknown ones.
    """
    if backend == "fake" or spec.startswith("fake"):  # scripted backends (tests) take a spec
        return _backend(backend or "fake")(spec=spec, **options)
    source = resolve_chat_model(spec)
    name = backend or default_backend(source.kind, say=True)
    return _backend(name)(source=source, **options)
