"""Which sampled responses a shard keeps (pure functions over the scores of one prompt group)."""

from __future__ import annotations

from dagrl.config.sample_schema import SampleConfig, SampleFilter


def kept_indices(scores: list[float], n: int, cfg: SampleConfig) -> list[int]:
    """Indices of the rows to keep; rows i*n .. i*n+n-1 are prompt i's samples.

    best_of_n: the n_best_to_keep highest of each group (ties: the earlier sample first);
    threshold: every row scoring >= cfg.threshold; keep_all: every row.
    """
    if cfg.filter == SampleFilter.keep_all:
        return list(range(len(scores)))
    if cfg.filter == SampleFilter.threshold:
        return [i for i, s in enumerate(scores) if s >= cfg.threshold]
    out = []
    for start in range(0, len(scores), n):
        group = sorted(range(start, start + n), key=lambda i: (-scores[i], i))
        out += sorted(group[: cfg.n_best_to_keep])
    return out
