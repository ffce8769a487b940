from pathlib import Path

import pytest

from workbench.config import ExperimentConfig, load_config
from workbench.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_every_shipped_config_validates():
    configs = sorted((REPO / "configs").glob("*.yaml"))
    assert configs
    for path in configs:
        load_config(path, environ={})


def test_overrides_and_precedence(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: fromyaml\nseed: 1\nmodels:\n  chat:\n    spec: yamlspec\n")
    # rows: (yaml, env, flag) -> expected
    cfg = load_config(path, environ={})
    assert (cfg.name, cfg.seed, cfg.models.chat.spec) == ("fromyaml", 1, "yamlspec")
    cfg = load_config(path, environ={"WB_SEED": "2", "WB_MODELS__CHAT__SPEC": "envspec"})
    assert (cfg.seed, cfg.models.chat.spec) == (2, "envspec")
    cfg = load_config(path, ["seed=3", "models.chat.spec=flagspec"],
                      environ={"WB_SEED": "2", "WB_MODELS__CHAT__SPEC": "envspec"})
    assert (cfg.seed, cfg.models.chat.spec) == (3, "flagspec")
    cfg = load_config(None, environ={"WB_HOME": "/x"})  # non-config WB_ vars are ignored
    assert cfg == ExperimentConfig()


def test_all_errors_reported_at_once(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: abc\nmodels:\n  chat:\n    spek: x\ngeneration:\n  temperature: -1\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, ["nokey", "generation.max_tokens=0"], environ={})
    msg = str(e.value)
    assert len(e.value.problems) == 5, e.value.problems
    for needle in ["seed", "models.chat.spek: unknown key", "generation.temperature",
                   "generation.max_tokens", "nokey"]:
        assert needle in msg


def test_yaml_syntax_error_names_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\nseed: [1, 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, environ={})
    assert "line" in str(e.value) and str(path) in str(e.value)
