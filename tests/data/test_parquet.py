"""Parquet round trip, tokenized datasets, and the resumable loader."""

import logging
import os

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dagrl.data import Example, PromptDataset, PromptLoader, read_rows, tokenize_messages, write_parquet
from dagrl.errors import ConfigError, DataError

# "<u>" + content + "\n" per message, then "<a>": one token per character, 2 more per message, 1 at the end.
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'][0] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<a>{% endif %}"
)


def char_tokenizer(chat_template=CHAT_TEMPLATE):
    """A character-level tokenizer with role markers as single tokens; no download needed."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, "<s>": 3, "<u>": 4, "<a>": 5}
    for char in [chr(i) for i in range(32, 127)] + ["\n"]:
        vocab.setdefault(char, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    wrapped.add_special_tokens({"additional_special_tokens": ["<s>", "<u>", "<a>"]})
    wrapped.chat_template = chat_template
    return wrapped


def make_row(i, question, teacher=False):
    row = {
        "data_source": "dagrl/arith",
        "prompt": [{"role": "user", "content": question}],
        "ability": "arith",
        "reward_model": {"style": "rule", "ground_truth": str(i)},
        "extra_info": {"split": "train", "index": i, "question": question},
    }
    if teacher:
        row["teacher_prompt"] = [{"role": "user", "content": f"{question} ref: {i}"}]
    return row


def write_rows(tmp_path, name, rows):
    path = str(tmp_path / name)
    write_parquet(rows, path)
    return path


def test_tokenize_messages_returns_plain_ids():
    tok = char_tokenizer()
    ids = tokenize_messages(tok, [{"role": "user", "content": "1+2="}])
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    assert "".join(tok.convert_ids_to_tokens(ids)) == "<u>1+2=\n<a>"


def test_tokenize_messages_needs_a_chat_template():
    with pytest.raises(ConfigError, match="actor_rollout_ref.model.path.*no chat_template"):
        tokenize_messages(char_tokenizer(chat_template=None), [{"role": "user", "content": "hi"}])


def test_round_trip_keeps_optional_columns(tmp_path):
    # the first row has no teacher_prompt: the column must still be written for the later rows
    rows = [make_row(0, "1+1="), make_row(1, "2+2=", teacher=True)]
    path = write_rows(tmp_path / "nested" / "dir", "train.parquet", rows)
    back = read_rows([path])
    assert back[0]["teacher_prompt"] is None
    assert back[1] == rows[1]
    assert {k: v for k, v in back[0].items() if k != "teacher_prompt"} == rows[0]
    assert [f for f in os.listdir(tmp_path / "nested" / "dir")] == ["train.parquet"]  # no temp file left


def test_write_parquet_rejects_bad_rows_and_writes_nothing(tmp_path):
    bad = make_row(1, "2+2=")
    bad["reward_model"] = {"style": "rule", "ground_truth": ""}
    path = tmp_path / "train.parquet"
    with pytest.raises(DataError, match=r"train\.parquet row 1: 'reward_model.ground_truth'"):
        write_parquet([make_row(0, "1+1="), bad], str(path))
    assert not path.exists()
    with pytest.raises(DataError, match="no rows to write"):
        write_parquet([], str(path))


def test_missing_and_non_parquet_files(tmp_path):
    with pytest.raises(DataError, match=r"^data.train_files: file .*nope.parquet does not exist"):
        read_rows([str(tmp_path / "nope.parquet")])
    with pytest.raises(DataError, match=r"^data.val_files: file .*nope.parquet does not exist"):
        read_rows(str(tmp_path / "nope.parquet"), key="data.val_files")
    text = tmp_path / "train.jsonl"
    text.write_text('{"question": "1+1"}\n')
    with pytest.raises(DataError, match="is not a readable parquet file"):
        read_rows([str(text)])


def test_read_rows_expands_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write_rows(tmp_path, "t.parquet", [make_row(0, "1+1=")])
    assert len(read_rows(["~/t.parquet"])) == 1


def test_read_rows_names_file_of_missing_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "raw.parquet"
    pq.write_table(pa.table({"question": ["1+1"], "answer": ["2"]}), path)
    with pytest.raises(DataError, match=r"raw\.parquet: missing column\(s\) \['data_source', 'prompt'"):
        read_rows([str(path)])


def test_dataset_tokenizes_and_filters_overlong(tmp_path, caplog):
    short = [make_row(i, "1+1=", teacher=(i == 0)) for i in range(3)]  # 7 tokens each
    long = [make_row(3, "12345+67890="), make_row(4, "99+99+99+99=")]  # 15 tokens each
    first = write_rows(tmp_path, "a.parquet", short[:2] + long[:1])
    second = write_rows(tmp_path, "b.parquet", short[2:] + long[1:])
    with caplog.at_level(logging.INFO, logger="dagrl.data.parquet"):
        dataset = PromptDataset([first, second], char_tokenizer(), max_prompt_length=10)
    assert len(dataset) == 3 and dataset.num_filtered == 2 and dataset.num_rows == 5
    assert "kept 3 of 5 prompts; dropped 2" in caplog.text
    example = dataset[0]
    assert isinstance(example, Example)
    assert example.ground_truth == "0" and example.data_source == "dagrl/arith"
    assert example.extra_info == {"split": "train", "index": 0, "question": "1+1="}
    assert len(example.prompt_ids) == 7
    # the teacher's prompt is its own row's privileged one, tokenized as the prompt is
    tok = char_tokenizer()
    assert "".join(tok.convert_ids_to_tokens(example.teacher_prompt_ids)) == "<u>1+1= ref: 0\n<a>"
    assert dataset[1].teacher_prompt_ids is None
    # index counts rows across files before filtering: the third kept prompt is row 3 overall
    assert [e.index for e in dataset.examples] == [0, 1, 3]


def test_dataset_without_filtering_names_the_row_and_keys(tmp_path):
    path = write_rows(tmp_path, "a.parquet", [make_row(0, "1+1="), make_row(1, "12345+67890=")])
    with pytest.raises(DataError) as info:
        PromptDataset([path], char_tokenizer(), max_prompt_length=10, filter_overlong=False)
    message = str(info.value)
    assert "a.parquet row 1: prompt is 15 tokens" in message
    assert "data.max_prompt_length=10" in message and "data.filter_overlong_prompts" in message


def test_dataset_with_nothing_left(tmp_path):
    path = write_rows(tmp_path, "a.parquet", [make_row(0, "12345+67890=")])
    with pytest.raises(DataError, match="no prompts left out of 1 rows"):
        PromptDataset([path], char_tokenizer(), max_prompt_length=4)


def test_dataset_from_rows_names_the_source():
    dataset = PromptDataset.from_rows([make_row(0, "1+1=")], char_tokenizer(), 10, source="built-in arith")
    assert len(dataset) == 1
    with pytest.raises(DataError, match="^built-in arith row 0: missing column"):
        PromptDataset.from_rows([{"prompt": []}], char_tokenizer(), 10, source="built-in arith")


class ListDataset(list):
    """The loader needs only len() and indexing."""


def drain(loader, steps):
    return [[e for e in loader.next_batch()] for _ in range(steps)]


def test_loader_epochs_are_seeded_permutations():
    import numpy as np

    loader = PromptLoader(ListDataset(range(10)), batch_size=3, shuffle=True, seed=5)
    assert loader.steps_per_epoch == 3
    batches = drain(loader, 6)
    for epoch in (0, 1):
        order = np.random.default_rng(5 + epoch).permutation(10).tolist()
        assert sum(batches[3 * epoch : 3 * epoch + 3], []) == order[:9]  # drop_last leaves out one
    assert loader.epoch == 2
    again = PromptLoader(ListDataset(range(10)), batch_size=3, shuffle=True, seed=5)
    assert drain(again, 6) == batches
    assert batches[:3] != batches[3:]


def test_loader_without_shuffle_or_drop_last():
    loader = PromptLoader(ListDataset(range(5)), batch_size=2, shuffle=False, seed=0, drop_last=False)
    assert loader.steps_per_epoch == 3
    assert drain(loader, 4) == [[0, 1], [2, 3], [4], [0, 1]]
    assert loader.epoch == 1


@pytest.mark.parametrize("stop_after", [0, 1, 2, 3, 5])
def test_loader_resume_continues_the_same_sequence(stop_after):
    data = ListDataset(range(7))
    reference = drain(PromptLoader(data, batch_size=2, shuffle=True, seed=3), 9)
    first = PromptLoader(data, batch_size=2, shuffle=True, seed=3)
    head = drain(first, stop_after)
    state = first.state_dict()
    assert set(state) == {"epoch", "position"}
    resumed = PromptLoader(data, batch_size=2, shuffle=True, seed=3)
    resumed.load_state_dict(dict(state))
    assert head + drain(resumed, 9 - stop_after) == reference


def test_loader_rejects_bad_sizes_and_states():
    with pytest.raises(DataError, match=r"data.train_batch_size=8 is larger than the dataset \(5 prompts\)"):
        PromptLoader(ListDataset(range(5)), batch_size=8, shuffle=True, seed=0)
    with pytest.raises(ConfigError, match="data.train_batch_size"):
        PromptLoader(ListDataset(range(5)), batch_size=0, shuffle=True, seed=0)
    loader = PromptLoader(ListDataset(range(5)), batch_size=2, shuffle=True, seed=0)
    with pytest.raises(DataError, match="train files or data.train_batch_size changed"):
        loader.load_state_dict({"epoch": 1, "position": 4})
    with pytest.raises(DataError, match="needs integer 'epoch' and 'position'"):
        loader.load_state_dict({"step": 3})


def test_loader_over_a_real_dataset(tmp_path):
    path = write_rows(tmp_path, "a.parquet", [make_row(i, f"{i}+{i}=") for i in range(6)])
    dataset = PromptDataset([path], char_tokenizer(), max_prompt_length=32)
    loader = PromptLoader(dataset, batch_size=4, shuffle=True, seed=0)
    batch = loader.next_batch()
    assert len(batch) == 4 and all(isinstance(e, Example) for e in batch)
    assert len({e.index for e in batch}) == 4


def _renamed_prompt_file(tmp_path, column: str) -> str:
    """A file of the layout with its prompt column under another name (written without the
    writer's checks, which expect `prompt`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [make_row(i, f"{i}+1=") for i in range(2)]
    rows = [{(column if k == "prompt" else k): v for k, v in row.items()} for row in rows]
    path = str(tmp_path / "renamed.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_a_prompt_key_the_file_lacks_is_one_error_naming_key_value_file_columns_and_fix(tmp_path):
    path = write_rows(tmp_path, "train.parquet", [make_row(0, "1+1=")])
    with pytest.raises(ConfigError) as info:
        read_rows(path, prompt_key="question")
    exc, text = info.value, str(info.value)
    assert (exc.key, exc.value) == ("data.prompt_key", "question")
    assert "\n" not in text and "data.train_files" in text and path in text
    assert "'reward_model'" in text and "set data.prompt_key=prompt" in text


def test_a_misspelt_prompt_key_is_told_the_nearest_column(tmp_path):
    path = _renamed_prompt_file(tmp_path, "question")
    with pytest.raises(ConfigError, match=r"did you mean data.prompt_key=question\?"):
        read_rows(path, key="data.val_files", prompt_key="questoin")
    assert [r["question"][0]["content"] for r in read_rows(path, prompt_key="question")] == ["0+1=", "1+1="]


def test_a_prompt_key_the_file_lacks_is_refused_by_the_dry_run(tmp_path, capsys):
    from tests.conftest import main_in_process

    path = write_rows(tmp_path, "train.parquet", [make_row(i, f"{i}+1=") for i in range(16)])
    code, out = main_in_process(
        capsys,
        f"data.train_files={path}",
        f"data.val_files={path}",
        "data.prompt_key=question",
        "trainer.dry_run=true",
    )
    errors = [line for line in out.splitlines() if line.startswith("error")]
    assert code != 0 and len(errors) == 1, out
    assert "data.prompt_key" in errors[0] and "'question'" in errors[0] and path in errors[0]
    assert "dry run: plan printed" not in out  # refused before the plan
