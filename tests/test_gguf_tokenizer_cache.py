"""A GGUF's tokenizer is read from the file once per tokenizer, not once per file: the
digest of its tokenizer values (`gguf_header.tokenizer_fingerprint`) names the folder that
`gguf_cache.gguf_tokenizer_folder` fills, so files written with one tokenizer share it
(reading a 49k vocabulary out of a GGUF takes seconds; the digest, a tenth of one)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from conftest import write_tiny_gguf

from workbench.models.gguf_cache import gguf_tokenizer_folder
from workbench.models.gguf_header import header_values, tokenizer_fingerprint
from workbench.models.resolve import resolve_chat_model


def _gguf(path: Path, *, name: str = "a", arch: str = "llama",
          template: str = "{{ messages }}", tokens: tuple[str, ...] = ("<s>", "a", "b")) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.name", name)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", list(tokens))
    w.add_array("tokenizer.ggml.merges", ["a b"])
    w.add_string("tokenizer.chat_template", template)
    w.add_uint32(f"{arch}.context_length", 64)
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_digest_follows_the_tokenizer_values_and_nothing_else(tmp_path):
    base = tokenizer_fingerprint(_gguf(tmp_path / "base.gguf"))
    assert base is not None and len(base) == 64
    # another file with the same values: the same tokenizer
    assert tokenizer_fingerprint(_gguf(tmp_path / "again.gguf")) == base
    # what the converter reads: the vocabulary, the chat template, the architecture, and the
    # name (transformers reads "mistral" or "umt5" there as another model type)
    assert tokenizer_fingerprint(_gguf(tmp_path / "v.gguf", tokens=("<s>", "a", "c"))) != base
    assert tokenizer_fingerprint(_gguf(tmp_path / "m.gguf", name="mistral")) != base
    assert tokenizer_fingerprint(_gguf(tmp_path / "t.gguf", template="{{ x }}")) != base
    assert tokenizer_fingerprint(_gguf(tmp_path / "q.gguf", arch="qwen2")) != base
    # the skip over the string arrays lands on the next value
    assert header_values(tmp_path / "base.gguf", (".context_length",)) == \
        {"llama.context_length": 64}
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00")
    assert tokenizer_fingerprint(bad) is None
    assert tokenizer_fingerprint(tmp_path / "missing.gguf") is None


def test_two_files_with_one_tokenizer_share_its_folder(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    first = write_tiny_gguf(tiny_model, tmp_path / "first.gguf")
    second = write_tiny_gguf(tiny_model, tmp_path / "second.gguf")
    folder = gguf_tokenizer_folder(resolve_chat_model(str(first)))
    made = (folder / "tokenizer.json").stat().st_mtime_ns
    assert gguf_tokenizer_folder(resolve_chat_model(str(second))) == folder
    assert (folder / "tokenizer.json").stat().st_mtime_ns == made  # not written again
    # tokenizer files beside a GGUF come first in transformers: such a file gets its own
    beside = tmp_path / "beside"
    beside.mkdir()
    third = write_tiny_gguf(tiny_model, beside / "third.gguf")
    (beside / "tokenizer_config.json").write_text("{}")
    assert gguf_tokenizer_folder(resolve_chat_model(str(third))) != folder
    want = AutoTokenizer.from_pretrained(tiny_model)
    got = AutoTokenizer.from_pretrained(folder)
    text = "Impedance matching, 50 Ω: a quarter-wave line."
    assert got(text)["input_ids"] == want(text)["input_ids"]
    assert got.chat_template == want.chat_template
