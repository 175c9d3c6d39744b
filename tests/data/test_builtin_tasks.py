"""Every built-in task builds its rows through one signature, so whoever reads them (training,
OPSD's privileged prompts, the sampling pipeline) never special-cases a task."""

from __future__ import annotations

import inspect

from dagrl.backends.hf_model import resolve_model_path
from dagrl.config.enums import BuiltinTask
from dagrl.data.builtin_tasks import BUILDERS, builtin_rows
from dagrl.trainer.setup import load_data
from tests.conftest import validated_config


def test_every_task_has_a_builder_with_the_shared_signature():
    assert set(BUILDERS) == set(BuiltinTask)
    signatures = {str(inspect.signature(b)) for b in BUILDERS.values()}
    assert len(signatures) == 1, signatures
    for task in BuiltinTask:
        assert all("teacher_prompt" in r for r in builtin_rows(task, "train", 3, 0, True))
        assert not any("teacher_prompt" in r for r in builtin_rows(task, "train", 3, 0, False))


def test_calculator_preset_loads_its_rows_under_grpo_and_opsd():
    """`experiment=multi_turn/calculator` read its rows through a builder that lacked the OPSD flag."""
    for algorithm in ("grpo", "opsd"):
        cfg = validated_config(
            "experiment=multi_turn/calculator",
            f"algorithm={algorithm}",
            "teacher.model=self" if algorithm == "opsd" else "teacher.model=null",
            "data.builtin_train_rows=8",
            "data.builtin_val_rows=4",
        )
        _, loader, val = load_data(cfg, resolve_model_path(cfg.actor_rollout_ref.model.path))
        assert len(val) == 4 and loader.steps_per_epoch >= 1
        assert (val[0].teacher_prompt_ids is not None) == (algorithm == "opsd")
