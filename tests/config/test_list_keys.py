"""Keys holding a list: verl's forms of them compose, and every fix about one shows the list form."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from dagrl.config.enums import LoggerName
from dagrl.errors import ConfigError
from dagrl.main import compose, parse_args


def loggers(*argv: str) -> list[LoggerName]:
    _, overrides = parse_args(list(argv))
    return OmegaConf.to_object(compose(overrides)).trainer.logger


@pytest.mark.parametrize(
    "override,expected",
    [
        ("trainer.logger=console", ["console"]),  # one name alone, as verl's Tracking takes it
        ("+trainer.logger=wandb", ["wandb"]),
        ("trainer.logger=[console,tensorboard]", ["console", "tensorboard"]),
        ("trainer.logger=['console','wandb']", ["console", "wandb"]),  # verl's scripts
        ('trainer.logger=["console"]', ["console"]),
    ],
)
def test_logger_takes_one_name_or_a_list(override, expected):
    assert loggers(override) == [LoggerName(x) for x in expected]


def test_logger_in_a_config_file_one_name_or_a_list(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("trainer:\n  logger: console\n")
    assert loggers("--config", str(path)) == [LoggerName.console]
    path.write_text("trainer.logger: [console, jsonl]\n")
    assert loggers("--config", str(path)) == [LoggerName.console, LoggerName.jsonl]


def test_a_misspelt_single_logger_names_the_nearest():
    with pytest.raises(ConfigError, match="did you mean 'console'") as info:
        loggers("trainer.logger=consol")
    assert info.value.key == "trainer.logger[0]"


@pytest.mark.parametrize(
    "override,key,fix",
    [
        ("trainer.logger=console,wandb", "trainer.logger", "give a list: 'trainer.logger=[console,wandb]'"),
        (
            "placement.colocate_groups=train",
            "placement.colocate_groups",
            "takes a list: 'placement.colocate_groups=[[train,rollout,ref]]'",
        ),
        (
            "placement.colocate_groups=[train,rollout]",
            "placement.colocate_groups[0]",
            "takes a list: 'placement.colocate_groups=[[train,rollout,ref]]'",
        ),
        (
            "actor_rollout_ref.actor.optim.betas=0.9",
            "actor_rollout_ref.actor.optim.betas",
            "takes a list: 'actor_rollout_ref.actor.optim.betas=[0.9,0.999]'",
        ),
        ("reward.functions=arith", "reward.functions", "takes a list: 'reward.functions=[{name: arith}]'"),
    ],
)
def test_a_fix_about_a_list_key_shows_the_list_form(override, key, fix):
    with pytest.raises(ConfigError) as info:
        compose([override])
    assert info.value.key == key and info.value.fix.endswith(fix), info.value.fix
    assert "quote the value" not in info.value.fix  # a quoted string is no list
