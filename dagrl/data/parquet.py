"""Reading prompt parquet files, tokenizing them once, and batching them over epochs.

    read_rows(files)  ->  PromptDataset (chat template applied, over-long prompts dropped)
                      ->  PromptLoader.next_batch() -> list[Example], forever, resumable

The loader's order is a pure function of (seed, epoch), so its whole state is two integers.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dagrl.data.messages import MESSAGES, conversation_ids, fill_from_messages, render_messages
from dagrl.data.schema import (
    check_prompt_column,
    response_text,
    teacher_messages,
    validate_columns,
    validate_row,
)
from dagrl.data.transforms import apply_row_transforms
from dagrl.errors import ConfigError, DataError

logger = logging.getLogger(__name__)


@dataclass
class Example:
    """One tokenized prompt.

    index: the row's position in the files it was read from, counting across files in the order given
    (before any filtering), so it names the source row and stays fixed when filtering changes.
    """

    index: int
    prompt_ids: list[int]
    data_source: str
    ground_truth: str
    extra_info: dict
    teacher_prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None  # the reference response + eos (data.response_key), if any
    response_loss_mask: list[int] | None = None  # SFT: 1 on response ids trained (None = all of them)


def read_rows(
    files: str | Sequence[str], *, key: str = "data.train_files", prompt_key: str = "prompt"
) -> list[dict]:
    """Read and validate every row of `files` (parquet), in order.

    `key` is the config key the files came from; it is named in errors.
    """
    rows: list[dict] = []
    for path in _as_list(files, key):
        rows.extend(_read_file(path, key=key, prompt_key=prompt_key))
    return rows


def _as_list(files: str | Sequence[str], key: str) -> list[str]:
    paths = [files] if isinstance(files, str) else list(files)
    if not paths:
        raise ConfigError(key, files, "give at least one parquet file, e.g. ~/data/gsm8k/train.parquet")
    return [os.path.expanduser(str(path)) for path in paths]


def _read_file(path: str, *, key: str, prompt_key: str) -> list[dict]:
    if not os.path.isfile(path):
        raise DataError(
            f"{key}: file {path} does not exist — check the path, or create it with a script in "
            "examples/data_preprocess (e.g. python3 gsm8k.py --local_dir ~/data/gsm8k)"
        )
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise DataError(
            f"{key}: file {path} is not a readable parquet file ({err}) — "
            "dagrl reads parquet only; convert json/jsonl with the scripts in examples/data_preprocess"
        ) from err
    if table.num_rows == 0:  # the columns may all be there: say which file is empty
        raise DataError(f"{key}: {path} has no rows — point {key} at a file with prompts in it")
    rows = table.to_pylist()
    if MESSAGES in table.column_names and prompt_key not in table.column_names:  # multi-turn SFT rows
        rows = [fill_from_messages(row) for row in rows]
    else:
        check_prompt_column(table.column_names, path, key, prompt_key)
        validate_columns(table.column_names, path, prompt_key=prompt_key)
    rows = apply_row_transforms(rows)  # plugins' transforms, validated as any row
    for index, row in enumerate(rows):
        validate_row(row, source=path, index=index, prompt_key=prompt_key)
    return rows


def tokenize_messages(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template, ending with the generation prompt."""
    return render_messages(tokenizer, messages, generation_prompt=True)


class PromptDataset:
    """All prompts of `files`, tokenized once with the chat template.

    With `filter_overlong`, prompts longer than `max_prompt_length` tokens are dropped and counted in
    `num_filtered`; without it, one such prompt is an error. The teacher prompt is tokenized too but
    not length-checked: it holds the reference solution and is only ever scored, never generated from.
    """

    def __init__(
        self,
        files: str | Sequence[str],
        tokenizer: Any,
        max_prompt_length: int,
        prompt_key: str = "prompt",
        filter_overlong: bool = True,
        *,
        key: str = "data.train_files",
        response_key: str = "response",
    ):
        tables = [(path, _read_file(path, key=key, prompt_key=prompt_key)) for path in _as_list(files, key)]
        self.response_key = response_key
        self._build(tables, tokenizer, max_prompt_length, prompt_key, filter_overlong, key)

    @classmethod
    def from_rows(
        cls,
        rows: list[dict],
        tokenizer: Any,
        max_prompt_length: int,
        *,
        source: str,
        prompt_key: str = "prompt",
        filter_overlong: bool = True,
        key: str = "data.train_files",
        response_key: str = "response",
    ) -> PromptDataset:
        """A dataset of in-memory rows (the built-in task); `source` names them in errors."""
        rows = apply_row_transforms([fill_from_messages(row) for row in rows])
        for index, row in enumerate(rows):
            validate_row(row, source=source, index=index, prompt_key=prompt_key)
        dataset = cls.__new__(cls)
        dataset.response_key = response_key
        dataset._build([(source, rows)], tokenizer, max_prompt_length, prompt_key, filter_overlong, key)
        return dataset

    def _build(self, tables, tokenizer, max_prompt_length, prompt_key, filter_overlong, key) -> None:
        if max_prompt_length <= 0:
            raise ConfigError("data.max_prompt_length", max_prompt_length, "must be a positive token count")
        self.max_prompt_length = max_prompt_length
        self.examples: list[Example] = []
        self.num_rows = 0
        self.num_filtered = 0
        for source, rows in tables:
            for row_index, row in enumerate(rows):
                example = self._tokenize_row(tokenizer, row, prompt_key)
                self.num_rows += 1
                if len(example.prompt_ids) <= max_prompt_length:
                    self.examples.append(example)
                elif filter_overlong:
                    self.num_filtered += 1
                else:
                    raise DataError(
                        f"{source} row {row_index}: prompt is {len(example.prompt_ids)} tokens, longer than "
                        f"data.max_prompt_length={max_prompt_length} — raise data.max_prompt_length or set "
                        "data.filter_overlong_prompts=true to drop such rows"
                    )
        logger.info(
            "%s: kept %d of %d prompts; dropped %d longer than data.max_prompt_length=%d",
            key, len(self.examples), self.num_rows, self.num_filtered, max_prompt_length,
        )  # fmt: skip
        if not self.examples:
            raise DataError(
                f"{key}: {', '.join(source for source, _ in tables)}: no prompts left out of"
                f" {self.num_rows} rows (dropped {self.num_filtered} longer "
                f"than data.max_prompt_length={max_prompt_length}) — raise data.max_prompt_length "
                "or check the files"
            )

    def _tokenize_row(self, tokenizer: Any, row: dict, prompt_key: str) -> Example:
        teacher = teacher_messages(row.get("teacher_prompt"))
        if row.get(MESSAGES) is not None:  # a whole conversation: SFT on its assistant turns
            prompt, response, mask = conversation_ids(tokenizer, row[MESSAGES], f"row {self.num_rows}")
            return Example(
                index=self.num_rows,
                prompt_ids=prompt,
                data_source=row["data_source"],
                ground_truth=row["reward_model"]["ground_truth"],
                extra_info=dict(row["extra_info"] or {}),
                response_ids=response,
                response_loss_mask=mask,
            )
        return Example(
            index=self.num_rows,
            prompt_ids=tokenize_messages(tokenizer, row[prompt_key]),
            data_source=row["data_source"],
            ground_truth=row["reward_model"]["ground_truth"],
            extra_info=dict(row["extra_info"] or {}),
            teacher_prompt_ids=tokenize_messages(tokenizer, teacher) if teacher is not None else None,
            response_ids=_response_ids(tokenizer, response_text(row, self.response_key)),
        )

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def has_responses(self) -> bool:
        return all(e.response_ids is not None for e in self.examples)

    def __getitem__(self, i: int) -> Example:
        return self.examples[i]


def _response_ids(tokenizer: Any, text: str | None) -> list[int] | None:
    """A reference response as the policy would emit it: its tokens, then the eos token."""
    if text is None:
        return None
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


class PromptLoader:
    """Batches of a dataset, epoch after epoch, forever.

    Epoch e visits the dataset in the order `numpy.random.default_rng(seed + e).permutation(n)`
    (or 0..n-1 without shuffle). The state is (epoch, position in that order), so a loader restored
    from `state_dict()` yields exactly the batches the saved one would have yielded next.
    """

    def __init__(self, dataset: Any, batch_size: int, shuffle: bool, seed: int, drop_last: bool = True):
        if batch_size <= 0:
            raise ConfigError("data.train_batch_size", batch_size, "must be a positive number of prompts")
        if batch_size > len(dataset):
            raise DataError(
                f"data.train_batch_size={batch_size} is larger than the dataset ({len(dataset)} prompts) — "
                "lower data.train_batch_size or add rows"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self._epoch = 0
        self._position = 0
        self._order_epoch = -1
        self._order: np.ndarray = np.arange(0)

    @property
    def steps_per_epoch(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (it moves on right after an epoch's last batch)."""
        return self._epoch

    def _epoch_end(self) -> int:
        return self.steps_per_epoch * self.batch_size if self.drop_last else len(self.dataset)

    def _order_of(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            n = len(self.dataset)
            rng = np.random.default_rng(self.seed + epoch)
            self._order = rng.permutation(n) if self.shuffle else np.arange(n)
            self._order_epoch = epoch
        return self._order

    def next_batch(self) -> list[Example]:
        """The next batch_size examples (fewer only for the last batch of an epoch without drop_last)."""
        order = self._order_of(self._epoch)
        end = min(self._position + self.batch_size, self._epoch_end())
        batch = [self.dataset[int(i)] for i in order[self._position : end]]
        self._position = end
        if self._position >= self._epoch_end():
            self._epoch, self._position = self._epoch + 1, 0
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        try:
            epoch, position = int(state["epoch"]), int(state["position"])
        except (KeyError, TypeError, ValueError) as err:
            raise DataError(f"data loader state {state!r} needs integer 'epoch' and 'position'") from err
        if epoch < 0 or not 0 <= position < self._epoch_end():
            raise DataError(
                f"data loader state {state!r} does not fit a dataset of {len(self.dataset)} prompts in "
                f"batches of {self.batch_size} — the train files or data.train_batch_size changed since "
                "the checkpoint; restore them, or start without resuming"
            )
        self._epoch, self._position = epoch, position
