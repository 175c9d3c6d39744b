"""Weight buckets for sync, shared by the train backends. (The actor's loss and the micro-batch
weights moved to dagrl/objectives, the update loop to backends/update_loop.py.)"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


def weight_buckets(
    named: Iterable[tuple[str, torch.Tensor]], limit_bytes: int, to_cpu: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """(name, tensor) pairs grouped into dicts of about limit_bytes (one tensor may exceed it)."""
    bucket, size = {}, 0
    for name, tensor in named:
        t = tensor.detach().cpu() if to_cpu else tensor.detach()
        if bucket and size + t.numel() * t.element_size() > limit_bytes:
            yield bucket
            bucket, size = {}, 0
        bucket[name] = t
        size += t.numel() * t.element_size()
    if bucket:
        yield bucket
