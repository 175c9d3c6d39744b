import pytest

from dagrl.rewards import extract_gsm8k_answer, get_reward
from dagrl.rewards.gsm8k import gsm8k_reward


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),  # strict
        ("Step 1 gives 12. #### 18\nSome trailing words with 99", "18"),  # first number after ####
        ("#### 5 then later #### 6", "6"),  # last #### wins
        ("3 + 4 = 7, so the answer is 7.", "7"),  # flexible: last number, trailing period dropped
        ("The total is $1,234,567.", "1234567"),  # commas and dollar sign stripped
        ("The temperature fell to -12 degrees", "-12"),
        ("#### -3", "-3"),
        ("Each costs $2.50", "2.50"),
        ("counts are 3, 4, 5", "5"),  # comma-separated list is not one number
        ("I do not know.", None),
        ("#### no number here", None),  # strict marker but nothing numeric after it
        ("", None),
    ],
)
def test_extract_gsm8k_answer(text, expected):
    assert extract_gsm8k_answer(text) == expected


def test_flexible_fallback_looks_only_at_the_tail():
    text = "The answer is 42. " + "blah " * 100
    assert extract_gsm8k_answer(text) is None
    assert extract_gsm8k_answer("7 " + "x" * 400 + " so 8") == "8"


def test_ground_truth_scores_one_and_wrong_answer_zero():
    reward = get_reward("gsm8k")
    assert reward("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72", {}) == 1.0
    assert reward("Natalia sold 48 + 24 = 71 clips.\n#### 71", "72", {}) == 0.0


@pytest.mark.parametrize(
    "solution, ground_truth, expected",
    [
        ("#### 1000", "1,000", 1.0),  # ground truth with commas
        ("#### 1,000", "1000", 1.0),
        ("#### 72.00", "72", 1.0),  # numeric, not string, comparison
        ("#### 72.5", "72", 0.0),
        ("so we get -5", "-5", 1.0),
        ("so we get 5", "-5", 0.0),
        ("no answer at all", "5", 0.0),
        ("#### 18", "Janet makes 9 * 2 = 18 dollars.\n#### 18", 1.0),  # full reference solution
    ],
)
def test_gsm8k_reward(solution, ground_truth, expected):
    assert gsm8k_reward(solution, ground_truth, {}) == expected


def test_strict_answer_beats_later_numbers():
    assert gsm8k_reward("#### 10\n(checked in 3 steps)", "10", {}) == 1.0
