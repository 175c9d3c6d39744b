"""Every numeric setting of the config tree declares its allowed range (once, on its field), and
validate refuses values outside it before Ray starts, naming the key and the range."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from dagrl.config.ranges import Range, check_ranges, field_range
from dagrl.config.schema import DagrlConfig
from dagrl.errors import ConfigError
from tests.conftest import compose_config


def _sections(cls, prefix=""):
    """(dotted prefix, dataclass type) of every section under DagrlConfig, lists of sections too."""
    yield prefix, cls
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        for arg in (hints[f.name], *typing.get_args(hints[f.name])):
            if dataclasses.is_dataclass(arg):
                yield from _sections(arg, f"{prefix}{f.name}.")


def _is_numeric(tp, default) -> bool:
    """int/float anywhere in the annotation (Optional, dict values, list items), or a list default
    of numbers (an untyped `list` such as optim.betas). bool is not numeric."""
    args = (tp, *typing.get_args(tp))
    nested = [a for t in args for a in (t, *typing.get_args(t))]
    if any(a in (int, float) for a in nested):
        return True
    return (
        isinstance(default, list)
        and bool(default)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in default)
    )


def numeric_fields():
    out = []
    for prefix, cls in _sections(DagrlConfig):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if _is_numeric(hints[f.name], default):
                out.append((f"{prefix}{f.name}", f))
    return out


def test_every_numeric_setting_declares_its_range():
    fields = numeric_fields()
    assert len(fields) > 60  # the walk reaches the whole tree
    assert [key for key, f in fields if field_range(f) is None] == []


def test_the_defaults_lie_in_their_ranges():
    check_ranges(DagrlConfig())


def test_ranges_read_as_intervals():
    assert Range(gt=0, le=1).describe() == "in (0, 1]"
    assert Range(ge=1, also=(-1,)).describe() == ">= 1, or -1"
    assert Range(ge=0, lt=1).describe() == "in [0, 1)"
    assert not Range().allows(math.nan) and not Range(ge=0).allows(math.inf)


@pytest.mark.parametrize(
    "override, key, words",
    [
        ("trainer.total_epochs=0", "trainer.total_epochs", ">= 1"),
        ("trainer.save_freq=-2", "trainer.save_freq", ">= 1, or -1 (-1 = never)"),
        ("trainer.test_freq=0", "trainer.test_freq", ">= 1, or -1"),
        ("actor_rollout_ref.actor.grad_clip=-1", "actor_rollout_ref.actor.grad_clip", "> 0"),
        ("actor_rollout_ref.actor.optim.betas=[0.9,1.0]", "actor_rollout_ref.actor.optim.betas[1]", "[0, 1)"),
        ("actor_rollout_ref.actor.optim.betas=[0.9]", "actor_rollout_ref.actor.optim.betas", "give 2"),
        ("actor_rollout_ref.actor.optim.eps=0", "actor_rollout_ref.actor.optim.eps", "> 0"),
        (
            "actor_rollout_ref.actor.optim.weight_decay=-0.1",
            "actor_rollout_ref.actor.optim.weight_decay",
            ">= 0",
        ),
        (
            "actor_rollout_ref.rollout.val_kwargs.top_p=2",
            "actor_rollout_ref.rollout.val_kwargs.top_p",
            "(0, 1]",
        ),
        ("actor_rollout_ref.rollout.val_kwargs.n=0", "actor_rollout_ref.rollout.val_kwargs.n", ">= 1"),
        ("data.seed=-1", "data.seed", ">= 0"),
        ("actor_rollout_ref.actor.kl_loss_coef=nan", "actor_rollout_ref.actor.kl_loss_coef", ">= 0"),
        ("+reward.functions=[{name: gsm8k, weight: inf}]", "reward.functions[0].weight", "finite"),
        ("placement.gpus.rollout=-1", "placement.gpus.rollout", ">= 0"),
    ],
)
def test_out_of_range_names_key_and_range(override, key, words):
    with pytest.raises(ConfigError) as err:
        check_ranges(compose_config(override))
    assert err.value.key == key and words in err.value.fix
