"""Writing prompt rows to parquet: validated first, then written atomically."""

from __future__ import annotations

import os
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

from dagrl.data.schema import validate_row
from dagrl.errors import DataError


def write_parquet(rows: list[dict], path: str) -> None:
    """Validate every row, then write them to `path` (parent dirs created).

    The file appears complete or not at all: it is written to a temp file beside `path` and renamed,
    so an interrupted run never leaves a half-written parquet for training to trip over.
    """
    path = os.path.expanduser(path)
    if not rows:
        raise DataError(f"{path}: no rows to write — every input row was skipped or the input was empty")
    for index, row in enumerate(rows):
        validate_row(row, source=path, index=index)
    table = _to_table(rows, path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp_path)
        os.replace(tmp_path, path)
    except BaseException:
        os.unlink(tmp_path)
        raise


def _to_table(rows: list[dict], path: str) -> pa.Table:
    # Table.from_pylist takes its columns from the first row only; an optional column such as
    # teacher_prompt must be kept even when the first row lacks it, so gather every column name.
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    try:
        return pa.table({col: [row.get(col) for row in rows] for col in columns})
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise DataError(
            f"{path}: rows cannot share one parquet schema ({err}) — give each column (and each extra_info "
            "key) the same type in every row"
        ) from err
