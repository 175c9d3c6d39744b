"""Row layout checks: every message names the source and row, what is wrong and the fix."""

import pytest

from dagrl.data.schema import REQUIRED_COLUMNS, teacher_messages, validate_columns, validate_row
from dagrl.errors import DataError


def good_row(**changes):
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2"},
        "extra_info": {"split": "train", "index": 0},
    }
    row.update(changes)
    return row


def test_good_rows_pass():
    validate_row(good_row(), source="f.parquet", index=0)
    validate_row(good_row(extra_info=None, teacher_prompt=None), source="f.parquet", index=0)
    teacher = [{"role": "user", "content": "1+1? A reference solution: 2"}]
    validate_row(good_row(teacher_prompt=teacher), source="f.parquet", index=0)


def test_required_columns_are_the_verl_layout():
    assert set(REQUIRED_COLUMNS) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}


def test_missing_column_is_named_with_source_and_row():
    row = good_row()
    del row["reward_model"]
    with pytest.raises(DataError, match=r"^f\.parquet row 7: missing column\(s\) \['reward_model'\]"):
        validate_row(row, source="f.parquet", index=7)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("What is 1+1?", "'prompt' must be a non-empty list of chat messages"),
        ([], "'prompt' must be a non-empty list of chat messages"),
        (["What is 1+1?"], r"'prompt'\[0\] must be a dict"),
        ([{"content": "hi"}], r"'prompt'\[0\] has no string 'role'"),
        ([{"role": "human", "content": "hi"}], r"'prompt'\[0\] has role 'human'; roles must be one of"),
        ([{"role": "user", "content": "a"}, {"role": "user"}], r"'prompt'\[1\] has no string 'content'"),
    ],
)
def test_bad_prompt_messages(prompt, expected):
    with pytest.raises(DataError, match=r"^src row 3: " + expected) as info:
        validate_row(good_row(prompt=prompt), source="src", index=3)
    assert "'role': 'user'" in str(info.value)  # the fix shows the expected shape


@pytest.mark.parametrize(
    ("reward_model", "expected"),
    [
        ({"style": "rule"}, "'reward_model' has no 'ground_truth'"),
        ({"style": "rule", "ground_truth": "  "}, "'reward_model.ground_truth' must be a non-empty string"),
        ({"style": "rule", "ground_truth": 2}, "'reward_model.ground_truth' must be a non-empty string"),
        ("2", "'reward_model' must be a dict"),
    ],
)
def test_bad_reward_model(reward_model, expected):
    with pytest.raises(DataError, match=r"^src row 0: " + expected):
        validate_row(good_row(reward_model=reward_model), source="src", index=0)


def test_malformed_teacher_prompt():
    with pytest.raises(
        DataError, match=r"row 2: 'teacher_prompt'\[0\] has role 'teacher'.*leave teacher_prompt null"
    ):
        validate_row(good_row(teacher_prompt=[{"role": "teacher", "content": "x"}]), source="src", index=2)
    with pytest.raises(DataError, match="'teacher_prompt'\\[0\\] must be a dict"):
        validate_row(good_row(teacher_prompt=["solve it"]), source="src", index=2)


def test_teacher_prompt_as_ms_swift_writes_it():
    """Empty means none (plain GKD for the row); a string is one user turn."""
    for empty in (None, "", []):
        validate_row(good_row(teacher_prompt=empty), source="src", index=0)
        assert teacher_messages(empty) is None
    validate_row(good_row(teacher_prompt="1+1? ref: 2"), source="src", index=0)
    assert teacher_messages("1+1? ref: 2") == [{"role": "user", "content": "1+1? ref: 2"}]


def test_other_column_types():
    with pytest.raises(DataError, match="'data_source' must be a string"):
        validate_row(good_row(data_source=None), source="src", index=0)
    with pytest.raises(DataError, match="'extra_info' must be a dict"):
        validate_row(good_row(extra_info="train"), source="src", index=0)
    with pytest.raises(DataError, match="a row must be a dict"):
        validate_row(["not", "a", "row"], source="src", index=0)


def test_custom_prompt_key():
    row = good_row()
    row["messages"] = row.pop("prompt")
    validate_row(row, source="src", index=0, prompt_key="messages")
    with pytest.raises(DataError, match=r"missing column\(s\) \['prompt'\]"):
        validate_row(row, source="src", index=0)


def test_validate_columns_names_missing_and_present():
    validate_columns(list(REQUIRED_COLUMNS) + ["teacher_prompt"], "f.parquet")
    with pytest.raises(DataError) as info:
        validate_columns(["question", "answer", "prompt"], "f.parquet")
    message = str(info.value)
    assert message.startswith(
        "f.parquet: missing column(s) ['data_source', 'ability', 'reward_model', 'extra_info']"
    )
    assert "the file has ['question', 'answer', 'prompt']" in message
    assert "docs/data.md" in message
