"""Prompt data: the parquet row layout, its reader and loader, and the writer used by preprocessing."""

from dagrl.data.parquet import Example, PromptDataset, PromptLoader, read_rows, tokenize_messages
from dagrl.data.schema import REQUIRED_COLUMNS, validate_columns, validate_row
from dagrl.data.writer import write_parquet

__all__ = [
    "REQUIRED_COLUMNS",
    "Example",
    "PromptDataset",
    "PromptLoader",
    "read_rows",
    "tokenize_messages",
    "validate_columns",
    "validate_row",
    "write_parquet",
]
