"""The built-in calculator task and its reward."""

from __future__ import annotations

from dagrl.data.builtin_calculator import generate_rows, sample_problems, tool_call_text
from dagrl.rewards.final_answer import final_answer_reward
from dagrl.rewards.registry import default_reward_name
from dagrl.tools.calculator import calculator_tool
from dagrl.tools.parsers import parse_hermes


def test_rows_are_three_digit_sums_in_disjoint_splits():
    rows = generate_rows("train", 50, seed=1)
    assert rows == generate_rows("train", 50, seed=1)
    a, b = map(int, rows[0]["extra_info"]["question"].rstrip("=").split("+"))
    assert 100 <= a <= 999 and rows[0]["reward_model"]["ground_truth"] == str(a + b)
    test = {frozenset(p) for p in sample_problems("test", 500, seed=0)}
    assert not test & {frozenset(p) for p in sample_problems("train", 2000, seed=0)}
    assert default_reward_name(rows[0]["data_source"]) == "final_answer"


def test_taught_call_runs_the_calculator_and_the_reward_reads_the_last_answer():
    (call,) = parse_hermes(tool_call_text(345, 678))
    assert calculator_tool().fn(**call.arguments) == "1023"
    assert final_answer_reward(tool_call_text(345, 678) + "1023", "1023") == 1.0
    assert final_answer_reward("1023", "1023") == 1.0  # answered without the tool: still scored
    assert final_answer_reward(tool_call_text(345, 678) + "1024", "1023") == 0.0


def test_the_calculator_experiment_loads_its_rows():
    # the shipped experiment's data loads (its generator takes no privileged-prompt flag)
    from dagrl.backends.hf_model import resolve_model_path
    from dagrl.config.validate import resolve_defaults
    from dagrl.trainer.setup import load_data
    from tests.conftest import compose_config

    cfg = compose_config(
        "experiment=multi_turn/calculator", "data.builtin_train_rows=8", "data.builtin_val_rows=4"
    )
    resolve_defaults(cfg)
    _, loader, val = load_data(cfg, resolve_model_path(cfg.actor_rollout_ref.model.path))
    assert len(loader.dataset) == 8 and len(val) == 4
    assert all(example.teacher_prompt_ids is None for example in loader.next_batch())
