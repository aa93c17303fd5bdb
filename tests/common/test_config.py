"""Config composition and validation: key paths in every error."""

from typing import Literal

import pytest
from pydantic import Field

from common.config import ConfigError, StrictModel, apply_flags, compose, load_config, validate


class Optim(StrictModel):
    lr: float = Field(default=1e-5, gt=0)
    schedule: Literal["constant", "cosine"] = "constant"


class Trainer(StrictModel):
    steps: int = 10
    optim: Optim = Optim()


class Run(StrictModel):
    experiment: str = "demo"
    trainer: Trainer = Trainer()


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_misspelt_key_names_the_full_path(tmp_path):
    path = write(tmp_path, "run.yaml", "trainer:\n  optim:\n    lr_shedule: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(Run, path)
    assert "trainer.optim.lr_shedule: unknown key" in str(err.value)
    assert "allowed keys: lr, schedule" in str(err.value)


def test_bad_value_names_path_and_allowed_values(tmp_path):
    path = write(tmp_path, "run.yaml", "trainer:\n  optim:\n    schedule: linear\n")
    with pytest.raises(ConfigError) as err:
        load_config(Run, path)
    message = str(err.value)
    assert "trainer.optim.schedule" in message and "'constant'" in message and "'cosine'" in message


def test_defaults_overrides_and_interpolation(tmp_path, monkeypatch):
    write(tmp_path, "base.yaml", "experiment: base\ntrainer:\n  steps: 5\n  optim:\n    lr: 0.1\n")
    path = write(tmp_path, "run.yaml",
                 "defaults: [base.yaml]\nexperiment: ${oc.env:EXP_NAME,fallback}\ntrainer:\n  steps: 7\n")
    monkeypatch.setenv("EXP_NAME", "from-env")
    run = load_config(Run, path, overrides=["trainer.optim.schedule=cosine"])
    assert run.experiment == "from-env"
    assert run.trainer.steps == 7 and run.trainer.optim.lr == 0.1 and run.trainer.optim.schedule == "cosine"


def test_section_and_flags_precedence(tmp_path):
    path = write(tmp_path, "run.yaml", "trainer:\n  steps: 3\n")
    trainer = load_config(Trainer, path, section="trainer")
    assert trainer.steps == 3
    assert apply_flags(trainer, steps=None).steps == 3  # a flag not given changes nothing
    assert apply_flags(trainer, steps=9).steps == 9


def test_secrets_are_refused_in_yaml(tmp_path):
    path = write(tmp_path, "run.yaml", "llm:\n  judge:\n    api_key: sk-123\n")
    with pytest.raises(ConfigError, match="llm.judge.api_key: secrets may not be set in YAML"):
        compose(path)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        compose(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        compose(write(tmp_path, "bad.yaml", "a: [1, 2\n"))
    with pytest.raises(ConfigError, match="key.path=value"):
        compose(None, ["noequals"])


def test_validate_plain_data():
    assert validate(Run, {"trainer": {"steps": 2}}).trainer.steps == 2
    with pytest.raises(ConfigError, match="trainer.steps"):
        validate(Run, {"trainer": {"steps": "many"}})
