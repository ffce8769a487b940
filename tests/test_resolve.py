import pytest

from workbench.errors import ModelNotFoundError
from workbench.models.resolve import resolve_chat_model, resolve_embedder


def test_bundled_names_resolve():
    for name in ("default", "smollm2", "SmolLM2-135M-Instruct"):
        src = resolve_chat_model(name)
        assert src.kind == "bundled-gguf" and src.gguf_file.endswith(".gguf")
    ident, folder = resolve_embedder("minilm")
    assert "MiniLM" in ident and (folder / "config.json").exists()


def test_paths_and_urls(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert resolve_chat_model(str(tmp_path / "hf")).kind == "hf-dir"
    g = tmp_path / "m.gguf"
    g.write_bytes(b"GGUF")
    assert resolve_chat_model(str(g)).kind == "gguf"
    src = resolve_chat_model("http://127.0.0.1:9/v1#qwen")
    assert (src.kind, src.url, src.remote_model) == ("openai", "http://127.0.0.1:9/v1", "qwen")
    assert resolve_chat_model("http://localhost:8000").url == "http://localhost:8000/v1"


@pytest.mark.parametrize("spec", ["no/such-model-anywhere", "./nothing-here", "gpt-99"])
def test_missing_model_is_one_actionable_line(spec):
    with pytest.raises(ModelNotFoundError) as e:
        resolve_chat_model(spec)
    msg = str(e.value)
    assert "\n" not in msg and spec in msg and "pass" in msg
