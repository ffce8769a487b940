"""What the bundled models are and whether they are usable here (no loading)."""

from __future__ import annotations

from workbench.errors import ModelNotFoundError
from workbench.models.local import gguf_cache_dir
from workbench.models.resolve import bundled_chat_source, bundled_embedder_path


def bundled_inventory() -> list[dict[str, str]]:
    rows = []
    try:
        src = bundled_chat_source()
        converted = (gguf_cache_dir(src) / "model.safetensors").exists()
        rows.append({"name": "smollm2-135m-instruct (default)", "role": "chat",
                     "status": "converted" if converted else "gguf-only",
                     "where": str(gguf_cache_dir(src) if converted
                                  else src.gguf_path)})
    except ModelNotFoundError as e:
        rows.append({"name": "smollm2-135m-instruct", "role": "chat", "status": "missing",
                     "where": str(e)})
    try:
        rows.append({"name": "minilm (default)", "role": "embedder", "status": "installed",
                     "where": str(bundled_embedder_path())})
    except ModelNotFoundError as e:
        rows.append({"name": "minilm", "role": "embedder", "status": "missing", "where": str(e)})
    return rows
