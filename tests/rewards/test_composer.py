import math

import pytest

from dagrl.errors import ConfigError, DataError
from dagrl.rewards import (
    RewardComposer,
    RewardTerm,
    default_reward_name,
    get_reward,
    mean_by_source,
    register_reward,
    registered_rewards,
)


def test_builtins_are_registered():
    for name in ["arith", "boxed_format", "gsm8k", "gsm8k_format", "math", "think_format"]:
        assert name in registered_rewards()
    assert registered_rewards() == sorted(registered_rewards())


def test_registering_a_name_twice_with_another_function_fails():
    def one(solution_str, ground_truth, extra_info):
        return 1.0

    def other(solution_str, ground_truth, extra_info):
        return 0.0

    register_reward("test_composer_dup")(one)
    register_reward("test_composer_dup")(one)  # same function again is fine
    with pytest.raises(ValueError, match="test_composer_dup"):
        register_reward("test_composer_dup")(other)


def test_unknown_reward_name_raises_config_error_listing_names():
    with pytest.raises(ConfigError) as info:
        get_reward("no_such_reward")
    message = str(info.value)
    assert "reward.functions" in message and "no_such_reward" in message
    assert "gsm8k" in message and "math" in message and "external_plugins" in message
    with pytest.raises(ConfigError, match="no_such_reward"):
        RewardComposer([RewardTerm("gsm8k"), RewardTerm("no_such_reward")])


@pytest.mark.parametrize(
    "source, expected",
    [
        ("openai/gsm8k", "gsm8k"),
        ("my-org/gsm8k-hard", "gsm8k"),
        ("dagrl/arith", "arith"),
        ("lighteval/MATH", "math"),
        ("DigitalLearningGmbH/MATH-lighteval", "math"),
        ("HuggingFaceH4/MATH-500", "math"),
        ("agentica-org/DeepScaleR-Preview-Dataset", "math"),
        ("someone/deepscaler-subset", "math"),
        ("my/competition_math", "math"),
    ],
)
def test_default_reward_name(source, expected):
    assert default_reward_name(source) == expected


def test_default_reward_name_unknown_source():
    with pytest.raises(DataError, match=r"'acme/poems'.*reward\.functions"):
        default_reward_name("acme/poems")


def test_weighted_sum_of_two_terms():
    composer = RewardComposer([RewardTerm("math", weight=1.0), RewardTerm("think_format", weight=0.5)])
    total, raw = composer.score("x", r"<think>1+1</think> \boxed{2}", "2", None)
    assert raw == {"math": 1.0, "think_format": 1.0}
    assert total == pytest.approx(1.5)
    total, raw = composer.score("x", r"<think>1+1</think> \boxed{3}", "2", None)
    assert raw == {"math": 0.0, "think_format": 1.0}
    assert total == pytest.approx(0.5)


def test_default_routing_by_data_source():
    composer = RewardComposer([])
    totals, raw = composer.score_batch(
        ["openai/gsm8k", "lighteval/MATH", "dagrl/arith", "dagrl/arith"],
        ["#### 72", r"\boxed{\frac12}", " -3 ", "-3 apples"],
        ["72", r"\frac{1}{2}", "-3", "-3"],
        [None, {}, None, None],
    )
    assert totals == [1.0, 1.0, 1.0, 0.0]
    assert raw["gsm8k"][0] == 1.0 and all(math.isnan(v) for v in raw["gsm8k"][1:])
    assert raw["arith"][2:] == [1.0, 0.0]
    with pytest.raises(DataError, match="acme/poems"):
        composer.score("acme/poems", "x", "y", None)


def test_score_batch_with_terms_keeps_lists_aligned():
    composer = RewardComposer([RewardTerm("gsm8k", 2.0), RewardTerm("gsm8k_format", 0.1)])
    totals, raw = composer.score_batch(["a", "b"], ["#### 5", "it is 5"], ["5", "5"], [None, None])
    assert totals == pytest.approx([2.1, 2.0])
    assert raw == {"gsm8k": [1.0, 1.0], "gsm8k_format": [1.0, 0.0]}


def test_duplicate_term_raises_config_error():
    with pytest.raises(ConfigError, match=r"reward\.functions\[1\]\.name"):
        RewardComposer([RewardTerm("gsm8k"), RewardTerm("gsm8k")])


def test_failing_reward_is_wrapped_as_data_error():
    @register_reward("test_composer_explodes")
    def explodes(solution_str, ground_truth, extra_info):
        raise KeyError("needs extra_info['tests']")

    composer = RewardComposer([RewardTerm("test_composer_explodes")])
    solution = "A" * 150 + "B" * 150
    with pytest.raises(DataError) as info:
        composer.score("acme/code", solution, "gt", None)
    message = str(info.value)
    assert "test_composer_explodes" in message and "acme/code" in message
    assert "A" * 150 + "B" * 50 in message and "B" * 51 not in message
    assert isinstance(info.value.__cause__, KeyError)


def test_arith_rejects_non_integer_ground_truth_as_data_error():
    composer = RewardComposer([RewardTerm("arith")])
    # the row's source, the reward's own error and the value it choked on, in one line
    with pytest.raises(
        DataError,
        match=r"reward 'arith' failed on a row of data_source 'dagrl/arith' \(ValueError: .*'three'\)",
    ):
        composer.score("dagrl/arith", "3", "three", None)


def test_mean_by_source():
    metrics = mean_by_source(
        [1.0, 0.0, 1.0, 0.5], ["openai/gsm8k", "openai/gsm8k", "lighteval/MATH", "dagrl/arith"]
    )
    assert metrics == {
        "reward/openai/gsm8k/mean": 0.5,
        "reward/lighteval/MATH/mean": 1.0,
        "reward/dagrl/arith/mean": 0.5,
    }
    assert mean_by_source([], []) == {}
