import pytest

from dagrl.rewards import get_reward, last_boxed_content, math_answers_equal, normalize_math_answer


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),  # nested braces
        (r"\boxed{3} first, then \boxed{4}", "4"),  # last box wins
        (r"The answer is \boxed 5", "5"),
        (r"The answer is $\boxed 5$.", "5"),
        (r"\fbox{x+1}", "x+1"),
        (r"\boxed{1} and finally \fbox{2}", "2"),
        (r"\boxed{\left(1, \{2\}\right)}", r"\left(1, \{2\}\right)"),
        ("no box here", None),
        (r"\boxed{unclosed", None),
    ],
)
def test_last_boxed_content(text, expected):
    assert last_boxed_content(text) == expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        (r" \dfrac{1}{2} ", r"\frac{1}{2}"),
        (r"\tfrac12", r"\frac{1}{2}"),
        (r"\frac1{2}", r"\frac{1}{2}"),
        (r"\frac{\frac12}{3}", r"\frac{\frac{1}{2}}{3}"),
        (r"\sqrt2", r"\sqrt{2}"),
        (r"10^\circ", "10"),
        (r"10^{\circ}", "10"),
        (r"\text{(A)}", "(A)"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"1\,000\!", "1000"),
        ("$5$.", "5"),
        ("x = 5", "5"),
        (r"\theta = \frac{\pi}{4}", r"\frac{\pi}{4}"),
        ("a = b = 3", "a=b=3"),  # not a single assignment: left as is
    ],
)
def test_normalize_math_answer(raw, expected):
    assert normalize_math_answer(raw) == expected


@pytest.mark.parametrize(
    "a, b",
    [
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        (r"\frac12", r"\frac{1}{2}"),
        (r"10^\circ", "10"),
        (r"\text{(A)}", "(A)"),
        ("0.50", "0.5"),
        ("1,000", "1000"),
        ("x=3", "3"),
        (r"\frac{1}{2}", "0.5"),
        (r"-\frac{1}{2}", "-0.5"),
    ],
)
def test_math_answers_equal(a, b):
    assert math_answers_equal(a, b)


@pytest.mark.parametrize(
    "a, b", [("0.5", "0.51"), (r"\frac{1}{3}", r"\frac{1}{2}"), ("(A)", "(B)"), ("x", "y")]
)
def test_math_answers_differ(a, b):
    assert not math_answers_equal(a, b)


@pytest.mark.parametrize(
    "solution, ground_truth, expected",
    [
        (r"Thus $\boxed{\dfrac{1}{2}}$.", r"\frac{1}{2}", 1.0),
        (r"Thus $\boxed{\dfrac{1}{2}}$.", r"\boxed{\frac12}", 1.0),  # boxed reference
        (r"First \boxed{3}, no wait, \boxed{4}", "4", 1.0),
        (r"First \boxed{4}, no wait, \boxed{3}", "4", 0.0),
        ("The answer is 4", "4", 0.0),  # no box -> 0
    ],
)
def test_math_reward(solution, ground_truth, expected):
    assert get_reward("math")(solution, ground_truth, {}) == expected
