"""Shared plumbing of the preprocessing scripts: options, loading, row building, reporting, writing.

Each script supplies `make_row(raw, index, split, opts) -> row` for its source (raising `RowError` for a
bad row) and a loader; this module turns raw records into dagrl rows, counts what was skipped and why,
and writes `<local_dir>/<split>.parquet` through `dagrl.data.write_parquet` (a split left with no
rows is not written, and the summary says so).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The scripts are run from this directory (`python3 gsm8k.py`); find dagrl in the checkout when it is
# not installed.
if importlib.util.find_spec("dagrl") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dagrl.data.writer import write_parquet  # noqa: E402
from dagrl.errors import DagrlError, DataError  # noqa: E402

DATA_SUFFIXES = (".json", ".jsonl", ".parquet")
MAX_LISTED_ROWS = 20


class RowError(Exception):
    """A source row that cannot become a dagrl row; the message is the reason, shared by like rows."""


@dataclass
class Options:
    local_dir: str
    local_src: str | None = None
    num_proc: int = 1
    instruction: str = ""
    teacher_prompt_template: str | None = None
    write_response: bool = False
    on_error: str = "skip"
    max_rows: int | None = None
    test_size: int = 500
    seed: int = 0


@dataclass
class SplitSource:
    """The raw records of one split: `data` is a list of records or a datasets.Dataset; `indices` are
    the positions in `data` to convert (also the row numbers reported and stored as extra_info.index)."""

    split: str
    data: Any
    indices: list[int]


@dataclass
class SplitReport:
    split: str
    rows_in: int = 0
    rows_out: int = 0
    skipped: dict[str, list[int]] = field(default_factory=dict)

    def describe(self) -> list[str]:
        lines = [
            f"{self.split}: {self.rows_in} rows in, {self.rows_out} rows out, {self.num_skipped} skipped"
        ]
        for reason, indices in sorted(self.skipped.items()):
            shown = ", ".join(str(i) for i in indices[:MAX_LISTED_ROWS])
            more = f" ... and {len(indices) - MAX_LISTED_ROWS} more" if len(indices) > MAX_LISTED_ROWS else ""
            lines.append(f"    {reason}: {len(indices)} row(s): {shown}{more}")
        return lines

    @property
    def num_skipped(self) -> int:
        return sum(len(indices) for indices in self.skipped.values())


# ---------------------------------------------------------------------------------------------- options


def make_parser(description: str, default_instruction: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--local_dir", required=True, help="output dir: writes train.parquet, test.parquet")
    parser.add_argument(
        "--local_src",
        default=None,
        help="a local copy of the source as published (a json/jsonl/parquet file or a dir of them); "
        "without it the dataset is downloaded with datasets.load_dataset",
    )
    parser.add_argument("--num_proc", type=int, default=1, help="processes for datasets.map (hub path)")
    parser.add_argument(
        "--instruction",
        default=default_instruction,
        help="appended to each question after a space; put {question} in it to place the question yourself",
    )
    parser.add_argument(
        "--teacher_prompt_template",
        default=None,
        help="for OPSD: the user message of a per-row teacher_prompt, with {question} (or {problem}) "
        "and {solution}, e.g. '{problem}\\nReference solution: {solution}\\n'; rows without a "
        "reference solution get no teacher_prompt",
    )
    parser.add_argument(
        "--write_response",
        action="store_true",
        help="write each row's reference solution as a `response` column (distillation's off-policy "
        "steps and SFT term: algorithm.gkd.lmbda < 1, sft_alpha > 0)",
    )
    parser.add_argument(
        "--on_error", choices=("skip", "fail"), default="skip", help="what to do with bad rows"
    )
    parser.add_argument("--max_rows", type=int, default=None, help="convert at most this many rows per split")
    return parser


def parse_options(parser: argparse.ArgumentParser, argv: list[str] | None) -> Options:
    args = parser.parse_args(argv)
    template = args.teacher_prompt_template
    if template is not None:
        template = args.teacher_prompt_template = template.replace("{problem}", "{question}")
        if not ("{question}" in template and "{solution}" in template):
            parser.error(
                "--teacher_prompt_template must contain both {question} (or {problem}) and {solution}"
            )
    if args.max_rows is not None and args.max_rows <= 0:
        parser.error("--max_rows must be positive")
    if args.num_proc <= 0:
        parser.error("--num_proc must be positive")
    return Options(**{key: value for key, value in vars(args).items() if key in Options.__dataclass_fields__})


# ---------------------------------------------------------------------------------------------- loading


def load_local(
    local_src: str, splits: tuple[str, ...], *, all_one_split: bool = False
) -> dict[str, SplitSource]:
    """Records of each split from a published file or dir.

    Split files are recognised by name: `train.jsonl`, `test.parquet`, `train-00000-of-00001.parquet`.
    With `all_one_split`, every data file is the (single) split, whatever its name.
    """
    files = _data_files(Path(local_src).expanduser())
    found: dict[str, list[Path]] = {split: [] for split in splits}
    for path in files:
        split = splits[0] if all_one_split else _split_of(path, splits)
        if split is not None:
            found[split].append(path)
    missing = [split for split, paths in found.items() if not paths]
    if missing:
        raise DataError(
            f"--local_src {local_src}: no file for split(s) {missing} among {[p.name for p in files]} — "
            f"name the files like {[s + '.jsonl' for s in splits]} or {splits[0]}-00000-of-00001.parquet"
        )
    sources = {}
    for split, paths in found.items():
        records = [record for path in paths for record in read_records(path)]
        sources[split] = SplitSource(split, records, list(range(len(records))))
    return sources


def _data_files(src: Path) -> list[Path]:
    if src.is_file():
        return [src]
    if not src.is_dir():
        raise DataError(f"--local_src {src} does not exist — give a downloaded file or dir of the dataset")
    files = sorted(p for p in src.iterdir() if p.is_file() and p.suffix in DATA_SUFFIXES)
    if not files:
        subdirs = sorted(p.name for p in src.iterdir() if p.is_dir())
        raise DataError(
            f"--local_src {src} holds no {'/'.join(DATA_SUFFIXES)} files — point it at the dir that holds "
            f"the split files" + (f" (one of the subdirs {subdirs}?)" if subdirs else "")
        )
    return files


def _split_of(path: Path, splits: tuple[str, ...]) -> str | None:
    stem = path.name[: -len(path.suffix)].lower()
    for split in splits:
        if re.fullmatch(rf"{split}(-.*)?", stem):
            return split
    return None


def read_records(path: Path) -> list[dict | None]:
    """The records of one file; a line or item that is not a JSON object becomes None (a bad row)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # often JSON Lines under a .json name; read it as such below
        if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
            data = next(iter(data.values()))  # {"data": [...]}
        if isinstance(data, list):
            return [item if isinstance(item, dict) else None for item in data]
    return [_parse_line(line) for line in text.splitlines() if line.strip()]


def _parse_line(line: str) -> dict | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def load_hub(hub_id: str, config: str | None, splits: tuple[str, ...]) -> dict[str, SplitSource]:
    """Each split of `hub_id` via datasets.load_dataset (imported here so --local_src needs no datasets)."""
    try:
        import datasets
    except ImportError as err:
        raise DataError(
            f"loading {hub_id} needs the 'datasets' package, which is not installed — pip install datasets, "
            "or download the dataset files and pass --local_src PATH"
        ) from err
    try:
        loaded = datasets.load_dataset(hub_id, config) if config else datasets.load_dataset(hub_id)
    except Exception as err:  # network, auth and hub errors come in many types; all mean the same here
        raise DataError(
            f"could not load {hub_id} from the Hugging Face hub ({type(err).__name__}: {err}) — if the hub "
            "is unreachable, download the dataset files elsewhere and pass --local_src PATH"
        ) from err
    missing = [split for split in splits if split not in loaded]
    if missing:
        raise DataError(f"{hub_id} has no split(s) {missing}; it has {list(loaded)}")
    return {split: SplitSource(split, loaded[split], list(range(len(loaded[split])))) for split in splits}


# ---------------------------------------------------------------------------------------------- rows


def require_text(raw: dict, key: str) -> str:
    """raw[key] as stripped non-empty text, or RowError."""
    if key not in raw or raw[key] is None:
        raise RowError(f"missing column '{key}'")
    value = raw[key]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise RowError(f"'{key}' is not text")
    if not value.strip():
        raise RowError(f"empty '{key}'")
    return value.strip()


def build_row(
    *,
    data_source: str,
    question: str,
    ground_truth: str,
    solution: str | None,
    opts: Options,
    extra_info: dict,
    ability: str = "math",
) -> dict:
    """A dagrl row: the question with the instruction as the prompt, plus a teacher_prompt when asked."""
    row = {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": apply_instruction(question, opts.instruction)}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
    }
    if opts.teacher_prompt_template and solution:
        # str.replace, not str.format: LaTeX braces in questions and templates must pass through as they are
        content = opts.teacher_prompt_template.replace("{question}", question).replace("{solution}", solution)
        row["teacher_prompt"] = [{"role": "user", "content": content}]
    if opts.write_response and solution:
        row["response"] = solution
    return row


def apply_instruction(question: str, instruction: str) -> str:
    if "{question}" in instruction:
        return instruction.replace("{question}", question)
    return f"{question} {instruction}" if instruction else question


# ---------------------------------------------------------------------------------------------- running

MakeRow = Callable[[dict, int, str, Options], dict]


def convert_split(source: SplitSource, make_row: MakeRow, opts: Options) -> tuple[list[dict], SplitReport]:
    """Convert one split, skipping bad rows into the report."""
    indices = source.indices[: opts.max_rows] if opts.max_rows else source.indices
    if isinstance(source.data, list):
        outcomes = [_convert_one(source.data[i], i, source.split, make_row, opts) for i in indices]
    else:
        outcomes = _convert_with_map(source.data, indices, source.split, make_row, opts)
    report, rows = SplitReport(source.split, rows_in=len(indices)), []
    for index, (row, reason) in zip(indices, outcomes):
        if reason is None:
            rows.append(row)
        else:
            report.skipped.setdefault(reason, []).append(index)
    report.rows_out = len(rows)
    return rows, report


def _convert_one(raw: Any, index: int, split: str, make_row: MakeRow, opts: Options):
    if not isinstance(raw, dict):
        return None, "not a JSON object"
    try:
        return make_row(raw, index, split, opts), None
    except RowError as err:
        return None, str(err)


def _convert_with_map(dataset: Any, indices: list[int], split: str, make_row: MakeRow, opts: Options):
    """The datasets path: the same conversion inside datasets.map, so --num_proc spreads it out."""
    subset = dataset.select(indices)
    convert = functools.partial(_map_one, indices=indices, split=split, make_row=make_row, opts=opts)
    mapped = subset.map(
        convert,
        with_indices=True,
        num_proc=opts.num_proc if opts.num_proc > 1 else None,
        remove_columns=subset.column_names,
        desc=f"converting {split}",
    )
    # Rows travel as JSON text: their optional teacher_prompt would not fit one arrow schema otherwise.
    return [
        (json.loads(row) if row else None, error or None)
        for row, error in zip(mapped["row"], mapped["error"])
    ]


def _map_one(raw: dict, position: int, *, indices, split, make_row, opts) -> dict:
    # datasets hands map functions a lazy row mapping; the scripts' make_row expects a plain dict
    row, reason = _convert_one(dict(raw), indices[position], split, make_row, opts)
    return {"row": json.dumps(row) if row is not None else "", "error": reason or ""}


def convert_and_write(name: str, sources: dict[str, SplitSource], make_row: MakeRow, opts: Options):
    """Convert every split, print the summary, then fail (on_error=fail with bad rows) or write."""
    results = {split: convert_split(source, make_row, opts) for split, source in sources.items()}
    reports = [report for _, report in results.values()]
    bad = [report for report in reports if report.num_skipped]
    if opts.on_error == "fail" and bad:
        print_summary(name, reports, written=[])
        first = bad[0]
        reason, indices = next(iter(first.skipped.items()))
        raise DataError(
            f"{name} {first.split} row {indices[0]}: {reason} ({sum(r.num_skipped for r in bad)} bad rows in "
            "all, listed above; nothing written) — fix the source rows or pass --on_error skip"
        )
    write_splits(name, {split: rows for split, (rows, _) in results.items()}, reports, opts.local_dir)
    return reports


def write_splits(name: str, rows: dict[str, list[dict]], reports: list[SplitReport], local_dir: str) -> None:
    """Write each split's rows to `<local_dir>/<split>.parquet`, then print the summary.

    A split with no rows is not written (an empty parquet only fails later, when training reads
    it) and the summary says so; an earlier run's file of that split is removed, so the directory
    holds what this run converted rather than a stale split beside a new one. No rows in any
    split is an error.
    """
    if not any(rows.values()):
        print_summary(name, reports, written=[])
        raise DataError(
            f"{name}: no rows in any split ({', '.join(rows)}); nothing written — check the source"
            " (--local_src) and the skipped rows listed above"
        )
    written, notes = [], []
    for split, split_rows in rows.items():
        path = os.path.join(os.path.expanduser(local_dir), f"{split}.parquet")
        if split_rows:
            write_parquet(split_rows, path)
            written.append(path)
            continue
        note = f"{split}: no rows, {path} not written"
        if os.path.exists(path):
            os.remove(path)
            note += " (the file an earlier run wrote there is removed)"
        notes.append(note)
    print_summary(name, reports, written, notes)


def print_summary(name: str, reports: list[SplitReport], written: list[str], notes: list[str] = ()) -> None:
    print(f"[{name}] summary")
    for report in reports:
        for line in report.describe():
            print(f"  {line}")
    for path in written:
        print(f"  wrote {path}")
    for note in notes:
        print(f"  {note}")


def run_main(main: Callable[[], Any]) -> int:
    """Run a script body; a dagrl error becomes one line on stderr and exit status 1."""
    try:
        main()
    except DagrlError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0
