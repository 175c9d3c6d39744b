"""A plugin role for the residency tests: `hidden` produces a large per-row tensor on its workers
(as a colocated teacher's hidden states), `consume` reads it on the same workers. With
`+roles.hid=hidden`."""

import torch

from dagrl.backends import register_backend
from dagrl.core.batch import Batch
from dagrl.core.calls import Collect, Dispatch, Execute, role_method

HIDDEN = 64  # [B, P, HIDDEN] float32 per call


def hidden_of(prompts: torch.Tensor) -> torch.Tensor:
    """[B, P] -> [B, P, HIDDEN]: a function of the row only, so the driver can check any piece."""
    return prompts.float()[:, :, None] * torch.arange(1, HIDDEN + 1, dtype=torch.float32)


class HiddenRole:
    def __init__(self, spec, ctx):
        self.rank = ctx.rank

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def hidden(self, batch: Batch) -> tuple[Batch, dict]:
        return Batch({"teacher_hidden": hidden_of(batch["prompts"])}), {"rank": float(self.rank)}

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def consume(self, batch: Batch) -> tuple[Batch, dict]:
        """Per row: the sum of its hidden states, and whether they are this row's (its prompts')."""
        hidden = batch["teacher_hidden"]
        right = torch.equal(hidden, hidden_of(batch["prompts"]))
        return Batch({"scores": hidden.sum((1, 2))}), {"right_rows": float(right), "rank": float(self.rank)}


def stored_entries(worker) -> int:
    """How many kept columns a worker holds (Worker.run calls it there)."""
    return len(worker.store.entries)


def count_object_fetches(worker) -> None:
    """From now on, count the objects this worker gets from Ray's object store for its calls'
    handed-over columns (`worker.object_fetches`): ray.get, as the worker's store calls it, counted."""
    import dagrl.core.residency as residency

    real = getattr(residency.ray, "real", residency.ray)

    class CountingRay:
        def __getattr__(self, name):
            return getattr(real, name)

        def get(self, refs, *args, **kwargs):
            worker.object_fetches += len(refs) if isinstance(refs, list) else 1
            return real.get(refs, *args, **kwargs)

    CountingRay.real = real
    worker.object_fetches = 0
    residency.ray = CountingRay()


def object_fetches(worker) -> tuple[int, int]:
    """(objects fetched since count_object_fetches, objects still cached); stops counting."""
    import dagrl.core.residency as residency

    residency.ray = getattr(residency.ray, "real", residency.ray)
    return worker.object_fetches, len(getattr(worker.store, "fetched", ()))


@register_backend("hid", "hidden")
def _hidden(spec, ctx, objective):
    return HiddenRole(spec, ctx)


class OneRankRole(HiddenRole):
    """The same calls as one DP rank over the pool's workers (as a TP group: every worker runs,
    rank 0 returns the output): against `hidden` on the same workers, a DP layout of 1 beside 2."""

    def dp_info(self) -> tuple[int, int, bool]:
        return 0, 1, self.rank == 0


@register_backend("tp1", "hidden_tp")
def _hidden_tp(spec, ctx, objective):
    return OneRankRole(spec, ctx)
