"""Allowed ranges of numeric settings, declared once next to each schema field and checked generically.

    train_batch_size: int = ranged(16, ge=1)
    \"\"\"Prompts per step.\"\"\"

`ranged` is `dataclasses.field` with the range in the field's metadata; `check_ranges` walks the
whole config tree (nested sections, lists of sections, dicts of numbers) and raises a ConfigError
naming the dotted key, the value and the allowed range before Ray starts. None passes wherever the
field is Optional (OmegaConf already refuses None elsewhere); NaN and ±inf never pass.
tests/config/test_ranges.py fails when a numeric field of the tree has no range.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from dagrl.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """Numbers v with ge <= v (or gt < v) and v <= le (or v < lt), or one of `also` (e.g. -1 = never).

    `length` fixes the number of items of a list-valued setting (optimizer betas); `hint` ends the
    message (what the out-of-range values would have meant, what to use instead).
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    also: tuple[float, ...] = ()
    length: int | None = None
    hint: str = ""

    def allows(self, value: float) -> bool:
        if value in self.also:
            return True
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def describe(self) -> str:
        lower = f">= {self.ge:g}" if self.ge is not None else f"> {self.gt:g}" if self.gt is not None else ""
        upper = f"<= {self.le:g}" if self.le is not None else f"< {self.lt:g}" if self.lt is not None else ""
        text = " and ".join(p for p in (lower, upper) if p) or "a finite number"
        if lower and upper:  # an interval reads better in interval notation
            text = (
                ("[" if self.ge is not None else "(")
                + f"{self.ge if self.ge is not None else self.gt:g}, "
                + f"{self.le if self.le is not None else self.lt:g}"
                + ("]" if self.le is not None else ")")
            )
            text = f"in {text}"
        if self.also:
            text += ", or " + " or ".join(f"{v:g}" for v in self.also)
        return text


def ranged(
    default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, **bounds
) -> Any:
    """A dataclass field whose value must lie in Range(**bounds)."""
    metadata = {"range": Range(**bounds)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_range(f: dataclasses.Field) -> Range | None:
    return f.metadata.get("range")


def check_ranges(section: Any, prefix: str = "") -> None:
    """Every ranged field of `section` and of the sections under it; ConfigError at the first out of range."""
    for f in dataclasses.fields(section):
        key, value = f"{prefix}{f.name}", getattr(section, f.name)
        rng = field_range(f)
        if rng is not None:
            _check_value(key, value, rng)
        elif dataclasses.is_dataclass(value):
            check_ranges(value, f"{key}.")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    check_ranges(item, f"{key}[{i}].")


def _check_value(key: str, value: Any, rng: Range) -> None:
    if value is None:
        return
    if isinstance(value, dict):
        for name, item in value.items():
            _check_value(f"{key}.{name}", item, rng)
        return
    if isinstance(value, (list, tuple)):
        if rng.length is not None and len(value) != rng.length:
            raise ConfigError(key, list(value), f"give {rng.length} numbers, each {rng.describe()}")
        for i, item in enumerate(value):
            _check_value(f"{key}[{i}]", item, rng)
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not rng.allows(value):
        hint = f" ({rng.hint})" if rng.hint else ""
        raise ConfigError(key, value, f"must be {rng.describe()}{hint}")
