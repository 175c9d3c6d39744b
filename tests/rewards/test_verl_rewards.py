"""Reward functions written for verl (`compute_score(data_source, solution_str, ground_truth,
extra_info=None)`, called by keyword, a float or a dict with "score") and for TRL, with the extra
keyword arguments a term passes (verl's custom_reward_function.reward_kwargs), on the built-in
task's rows."""

from __future__ import annotations

import textwrap

import pytest

from dagrl.core.plugins import load_plugins
from dagrl.data.builtin import generate_rows
from dagrl.errors import ConfigError
from dagrl.rewards import RewardComposer, RewardTerm
from dagrl.rewards.registry import RewardForm, get_reward, reward_form

PLUGIN = '''
CALLS = []

def verl_exact(data_source, solution_str, ground_truth, extra_info=None):
    """verl's signature; the reward manager calls it by keyword."""
    CALLS.append(dict(data_source=data_source, solution_str=solution_str, extra_info=extra_info))
    return 1.0 if solution_str.strip() == ground_truth else 0.0

def verl_exact_dict(data_source, solution_str, ground_truth, extra_info=None):
    correct = solution_str.strip() == ground_truth
    return {"score": 1.0 if correct else -0.5, "acc": correct}

def verl_no_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"acc": 1.0}

def verl_scaled(data_source, solution_str, ground_truth, extra_info=None, correct=1.0, **kwargs):
    return correct if solution_str.strip() == ground_truth else kwargs["wrong"]

def two_arguments(solution_str, ground_truth):
    return 0.0

def trl_prompts_first(prompts, completions, ground_truth, bonus=0.0, **kwargs):
    """TRL's form with prompts before completions, as many GRPOTrainer examples write it."""
    assert len(prompts) == len(completions)
    return [float(c.strip() == g) + bonus for c, g in zip(completions, ground_truth)]
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    path = tmp_path_factory.mktemp("verl") / "verl_rewards.py"
    path.write_text(textwrap.dedent(PLUGIN))
    load_plugins([str(path)])
    import dagrl_plugin_verl_rewards as module

    return module


def arith_batch() -> tuple[list, list, list, list]:
    """Four rows of the built-in task, answered right, wrong, right, wrong."""
    rows = generate_rows("test", 4, seed=0)
    truths = [row["reward_model"]["ground_truth"] for row in rows]
    answers = [t if i % 2 == 0 else str(int(t) + 1) for i, t in enumerate(truths)]
    return [r["data_source"] for r in rows], answers, truths, [r["extra_info"] for r in rows]


def test_verl_compute_score_is_called_by_keyword(plugin):
    assert reward_form(get_reward("verl_exact")) == RewardForm.verl
    assert reward_form(get_reward("arith")) == RewardForm.per_response  # dagrl's own, positional
    sources, answers, truths, extras = arith_batch()
    plugin.CALLS.clear()
    totals, raw = RewardComposer([RewardTerm("verl_exact")]).score_batch(sources, answers, truths, extras)
    # called positionally, the function saw the response as data_source and scored 0 everywhere
    assert raw["verl_exact"] == [1.0, 0.0, 1.0, 0.0] and totals == [1.0, 0.0, 1.0, 0.0]
    assert [c["solution_str"] for c in plugin.CALLS] == answers
    assert [c["data_source"] for c in plugin.CALLS] == ["dagrl/arith"] * 4
    assert [c["extra_info"] for c in plugin.CALLS] == extras


def test_a_dict_result_scores_by_its_score_entry(plugin):
    sources, answers, truths, extras = arith_batch()
    totals, _ = RewardComposer([RewardTerm("verl_exact_dict", 2.0)]).score_batch(
        sources, answers, truths, extras
    )
    assert totals == [2.0, -1.0, 2.0, -1.0]
    with pytest.raises(Exception, match=r"without a 'score' entry \(keys: \['acc'\]\)"):
        RewardComposer([RewardTerm("verl_no_score")]).score_batch(sources, answers, truths, extras)


def test_term_kwargs_reach_every_call(plugin):
    sources, answers, truths, extras = arith_batch()
    term = RewardTerm("verl_scaled", kwargs={"correct": 3.0, "wrong": -1.0})
    totals, _ = RewardComposer([term]).score_batch(sources, answers, truths, extras)
    assert totals == [3.0, -1.0, 3.0, -1.0]
    trl = RewardTerm("trl_prompts_first", kwargs={"bonus": 0.5})
    prompts = [e["question"] for e in extras]
    totals, _ = RewardComposer([trl]).score_batch(sources, answers, truths, extras, prompts=prompts)
    assert totals == [1.5, 0.5, 1.5, 0.5]


def test_kwargs_a_function_does_not_take_are_refused_before_scoring(plugin):
    with pytest.raises(ConfigError) as info:
        RewardComposer([RewardTerm("verl_exact", kwargs={"format_score": 0.1})])
    assert info.value.key == "reward.functions[0].kwargs" and info.value.value == {"format_score": 0.1}
    assert "unexpected keyword argument 'format_score'" in info.value.fix
    with pytest.raises(ConfigError) as info:  # a positional reward that cannot take three arguments
        RewardComposer([RewardTerm("two_arguments")])
    assert info.value.key == "reward.functions[0].name" and "cannot be called as a reward" in info.value.fix


def test_trl_form_is_told_by_a_completions_parameter_anywhere(plugin):
    assert reward_form(get_reward("trl_prompts_first")) == RewardForm.trl
    sources, answers, truths, extras = arith_batch()
    prompts = [e["question"] for e in extras]
    composer = RewardComposer([RewardTerm("trl_prompts_first")])
    assert composer.wants_prompts
    _, raw = composer.score_batch(sources, answers, truths, extras, prompts=prompts)
    assert raw["trl_prompts_first"] == [1.0, 0.0, 1.0, 0.0]
