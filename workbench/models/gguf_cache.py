"""Where the folders made from a GGUF file are kept under `workbench_home()/models`: its
transformers conversion (by path, size and modification time) and its tokenizer in Hugging
Face form (by what the tokenizer is made of, so files that share one share its folder)."""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import version
from pathlib import Path

from workbench.models.gguf_header import tokenizer_fingerprint
from workbench.models.publish import publish_once
from workbench.models.resolve import ModelSource, workbench_home


def gguf_cache_dir(source: ModelSource) -> Path:
    """Where a GGUF's weights, converted once to safetensors, are kept (by path, size and
    modification time: a rewritten file is converted afresh)."""
    gguf = source.gguf_path
    st = gguf.stat()
    tag = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()
    return workbench_home() / "models" / f"{gguf.stem}-{tag[:12]}"


TOKENIZER_DONE = "workbench-tokenizer.json"  # the tokenizer folder's marker, written last
# files beside a GGUF that transformers reads before the GGUF's own tokenizer
BESIDE = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "chat_template.jinja",
          "special_tokens_map.json", "additional_chat_templates")


def gguf_tokenizer_folder(source: ModelSource) -> Path:
    """A folder holding a GGUF's tokenizer (and chat template) in Hugging Face form, made once
    per tokenizer, not per file: keyed by the digest of the file's tokenizer values
    (`gguf_header.tokenizer_fingerprint`) and the transformers version that converts them, so
    files written with one tokenizer and name share one (test models, copies). Reading a tokenizer from a
    GGUF parses its whole vocabulary (2-4 s for a 49k one); from this folder, a tenth of that.
    A file whose header cannot be digested, or with tokenizer files beside it (transformers
    reads those first), gets a folder of its own, as before."""
    beside = any((source.folder / name).exists() for name in BESIDE)
    fingerprint = None if beside else tokenizer_fingerprint(source.gguf_path)
    if fingerprint is None:
        converted = gguf_cache_dir(source)
        target = converted.with_name(converted.name + "-tokenizer")
    else:
        key = hashlib.sha256(f"{fingerprint}|{version('transformers')}".encode()).hexdigest()
        target = workbench_home() / "models" / f"tokenizer-{key[:16]}"

    def write(tmp: Path) -> None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(source.folder, gguf_file=source.gguf_file)
        tok.save_pretrained(tmp)
        (tmp / TOKENIZER_DONE).write_text(json.dumps(
            {"gguf": str(source.gguf_path), "tokenizer_fingerprint": fingerprint}))

    publish_once(target, write, complete=lambda f: (f / TOKENIZER_DONE).is_file())
    return target
