"""How a call into a role is spread over its workers: dispatch, execute, collect.

The vocabulary is ms-swift's RayHelper. Each role method declares it where it is defined:

    class EchoBackend:
        @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
        def shout(self, batch: Batch) -> Batch: ...

and the driver calls it through the role's handle: `handle.call(EchoBackend.shout, batch)`.

- dispatch (applies to the first positional argument, the data; other arguments go to every
  worker unchanged): `slice` = the worker's DP shard (a Batch is split with `Batch.split`, a list
  in contiguous chunks; TP/PP ranks of one DP group get the same shard), `all` = the whole data to
  every worker, or a function `(n, i, data) -> shard` of the worker count and the worker index.
- execute: `first` = only worker 0 runs, `all` = every worker runs (collectives need all).
- collect: `none` = the list of results, one per worker that ran; `flatten` = the results of the
  workers that hold output (one per DP rank, in DP order) joined: Batches concatenated, lists
  chained, `(Batch, metrics)` pairs become `(concatenated Batch, [metrics per DP rank])`; or a
  function of the list of results, one per worker that ran.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from dagrl.core.batch import Batch


class Dispatch(str, Enum):
    slice = "slice"
    all = "all"


class Execute(str, Enum):
    first = "first"
    all = "all"


class Collect(str, Enum):
    none = "none"
    flatten = "flatten"


DispatchFn = Callable[[int, int, Any], Any]
CollectFn = Callable[[list], Any]


@dataclass(frozen=True)
class CallSpec:
    dispatch: Dispatch | DispatchFn = Dispatch.all
    execute: Execute = Execute.all
    collect: Collect | CollectFn = Collect.none


_ATTR = "__dagrl_call__"


def role_method(
    dispatch: Dispatch | DispatchFn = Dispatch.all,
    execute: Execute = Execute.all,
    collect: Collect | CollectFn = Collect.none,
):
    """Declare how a backend method is distributed; the method itself is unchanged."""
    spec = CallSpec(dispatch, Execute(execute), collect)

    def wrap(fn):
        setattr(fn, _ATTR, spec)
        return fn

    return wrap


def call_spec(method: Callable) -> CallSpec:
    spec = getattr(method, _ATTR, None)
    assert spec is not None, f"{getattr(method, '__qualname__', method)} is not declared with @role_method"
    return spec


def dispatch_shards(
    spec: CallSpec, data: Any, ranks: Sequence[tuple[int, int, bool]], workers: Sequence[int]
) -> list:
    """The data each running worker gets. `ranks` is (dp_rank, dp_size, returns_output) per worker;
    `workers` the indices of the workers that run."""
    how = spec.dispatch
    if how == Dispatch.all:
        return [data for _ in workers]
    if how == Dispatch.slice:
        if spec.execute == Execute.first:
            return [data]
        dp_size = ranks[0][1]
        shards = _split(data, dp_size)
        return [shards[ranks[w][0]] for w in workers]
    return [how(len(workers), i, data) for i in range(len(workers))]


def collect_results(spec: CallSpec, results: list, ranks: Sequence[tuple[int, int, bool]]) -> Any:
    """Join the results of the workers that ran (in worker order)."""
    how = spec.collect
    if how == Collect.none:
        return results
    if how == Collect.flatten:
        if spec.execute == Execute.first:
            kept = results
        else:
            order = sorted((ranks[i][0], i) for i in range(len(results)) if ranks[i][2])
            kept = [results[i] for _, i in order]
        return _join(kept)
    return how(results)


def _split(data: Any, n: int) -> list:
    if isinstance(data, Batch):
        return data.split(n)
    items = list(data)
    assert len(items) % n == 0, f"{len(items)} items do not split over {n} DP ranks"
    size = len(items) // n
    return [items[i * size : (i + 1) * size] for i in range(n)]


def _join(results: list) -> Any:
    if not results:
        return results
    first = results[0]
    if isinstance(first, Batch):
        return Batch.concat(results)
    if isinstance(first, tuple) and len(first) == 2 and isinstance(first[0], Batch):
        return Batch.concat([r[0] for r in results]), [r[1] for r in results]
    if isinstance(first, list):
        return [x for r in results for x in r]
    return results
