"""ms-swift's `device_groups` form of placement, turned into the same groups as colocate_groups.

    placement:
      device_groups:
        nproc_per_node: 4          # = trainer.n_gpus_per_node (sets it when that is left at 1)
        actor:                     # a group name (free text)
          device: GPU
          ranks: list(range(0, 2)) # global GPU indices: a list, a count, or this string
          workers: [train, ref]    # roles sharing these devices (colocated)
        sampler: {device: GPU, ranks: [2, 3], workers: [rollout]}
        judge: {device: CPU, ranks: 2, workers: [reward]}   # CPU workers, no GPU

Also accepted as one JSON string on the command line. Roles in one group are colocated; groups
must not share GPUs. A GPU group's ranks are device slots of the declared cluster (slot s lives
on node s // nproc_per_node); a count takes the next free ones. CPU groups get CPU-only workers.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dagrl.errors import ConfigError

KEY = "placement.device_groups"
_RANGE = re.compile(r"^\s*list\(\s*range\(\s*(\d+)\s*,\s*(\d+)\s*\)\s*\)\s*$")


def declared_nproc(raw: Any) -> int | None:
    """The groups' nproc_per_node, or None when they do not give it."""
    nproc = _as_dict(raw).get("nproc_per_node")
    if nproc is not None and (isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1):
        raise ConfigError(f"{KEY}.nproc_per_node", nproc, "GPUs per node: a whole number >= 1")
    return nproc


def parse_device_groups(
    raw: Any, n_gpus_per_node: int, total: int
) -> list[tuple[str, str, list[str], list[int] | int]]:
    """[(group name, device 'gpu'|'cpu', roles, GPU slots or a CPU worker count)] in declaration order."""
    groups = _as_dict(raw)
    nproc = groups.pop("nproc_per_node", n_gpus_per_node)
    if nproc != n_gpus_per_node:
        raise ConfigError(
            f"{KEY}.nproc_per_node",
            nproc,
            f"trainer.n_gpus_per_node={n_gpus_per_node} says otherwise; give one of them (either sets the other)",
        )
    out, taken, seen_roles = [], set(), set()
    pending_counts = []
    for name, body in groups.items():
        key = f"{KEY}.{name}"
        if not isinstance(body, dict) or set(body) - {"device", "ranks", "workers"} or "workers" not in body:
            raise ConfigError(
                key, body, "a group is {device: GPU|CPU, ranks: [..]|n|'list(range(a, b))', workers: [roles]}"
            )
        device = str(body.get("device", "GPU")).upper()
        if device not in ("GPU", "CPU"):
            raise ConfigError(f"{key}.device", body.get("device"), "use GPU or CPU")
        roles = [str(r) for r in body["workers"]]
        dup = seen_roles & set(roles)
        if dup:
            raise ConfigError(f"{key}.workers", roles, f"role(s) {sorted(dup)} are already in another group")
        seen_roles |= set(roles)
        ranks = _ranks(body.get("ranks"), f"{key}.ranks")
        if device == "CPU":
            out.append((name, "cpu", roles, ranks if isinstance(ranks, int) else len(ranks)))
            continue
        if isinstance(ranks, int):
            pending_counts.append(len(out))
            out.append((name, "gpu", roles, ranks))
            continue
        bad = [r for r in ranks if not 0 <= r < total]
        if bad or taken & set(ranks) or len(set(ranks)) != len(ranks):
            raise ConfigError(
                f"{key}.ranks",
                ranks,
                f"GPU ranks must be distinct, unused by other groups and in [0, {total})"
                " (trainer.nnodes × trainer.n_gpus_per_node)",
            )
        taken |= set(ranks)
        out.append((name, "gpu", roles, list(ranks)))
    for i in pending_counts:  # counts take the lowest free ranks, after the explicit ones are known
        name, device, roles, count = out[i]
        free = [r for r in range(total) if r not in taken][:count]
        if len(free) < count:
            raise ConfigError(
                f"{KEY}", count, f"group of {roles} asks for {count} GPUs; only {len(free)} are free"
            )
        taken |= set(free)
        out[i] = (name, device, roles, free)
    return out


def _as_dict(raw: Any) -> dict:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(KEY, raw, f"not valid JSON ({exc}); give a mapping of groups") from None
    if not isinstance(raw, dict):
        raise ConfigError(KEY, raw, "give a mapping: nproc_per_node and named groups")
    return dict(raw)


def _ranks(value: Any, key: str) -> list[int] | int:
    if isinstance(value, bool) or value is None:
        raise ConfigError(key, value, "give a list of ranks, a count, or 'list(range(a, b))'")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(key, value, "a count must be >= 1")
        return value
    if isinstance(value, str):
        m = _RANGE.match(value)
        if not m or int(m.group(1)) >= int(m.group(2)):
            raise ConfigError(key, value, "the string form is 'list(range(a, b))' with a < b")
        return list(range(int(m.group(1)), int(m.group(2))))
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        return [int(v) for v in value]
    raise ConfigError(key, value, "give a non-empty list of integer ranks, a count, or 'list(range(a, b))'")
