"""A user plugin written only in tests/: a role class with declared methods, its backend
registration, and a node kind that calls it. `external_plugins=[tests/plugins/echo_role.py]`
plus `dag=tests/plugins/echo.yaml` and `+roles.echo=counter` run it."""

import torch

from dagrl.backends import register_backend
from dagrl.core.batch import Batch, declare_key
from dagrl.core.calls import Collect, Dispatch, Execute, role_method
from dagrl.core.node import NodeResult, register_node_kind

declare_key("echo_tokens", "[B] prompt tokens of each row, counted on the echo role")


class CounterRole:
    """Counts prompt tokens. No model: the point is the calls, not the work."""

    def __init__(self, spec, ctx, objective=None):
        self.rank, self.world = ctx.rank, ctx.world_size
        self.spec, self.objective = spec, objective

    @role_method(dispatch=Dispatch.all, execute=Execute.all, collect=Collect.none)
    def parts(self) -> tuple:
        """What this worker was built from: its spec's micro-batch size and its objective."""
        return self.spec.micro_batch_size, self.objective

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def count(self, batch: Batch) -> Batch:
        return Batch({"echo_tokens": batch["prompt_mask"].sum(1)})

    @role_method(dispatch=Dispatch.all, execute=Execute.all, collect=Collect.none)
    def rank_of(self, tag: str) -> tuple[int, int, str]:
        return self.rank, self.world, tag

    @role_method(dispatch=Dispatch.all, execute=Execute.first, collect=Collect.none)
    def first(self) -> int:
        return self.rank

    @role_method(
        dispatch=lambda n, i, data: data[i::n],  # round-robin, not contiguous
        execute=Execute.all,
        collect=lambda results: sorted(x for r in results for x in r),
    )
    def double(self, items: list) -> list:
        return [(x * 2, self.rank) for x in items]

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def tag_rows(self, items: list) -> list:
        return [(x, self.rank) for x in items]


@register_backend("echo", "counter")
def _counter(spec, ctx, objective):
    return CounterRole(spec, ctx, objective)


@register_node_kind("echo_count")
class EchoCountNode:
    required_inputs = ("prompts", "prompt_mask")
    optional_inputs = ()
    outputs = ("echo_tokens",)
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        handle = runtime.role(self.spec.role)
        out = handle.call(CounterRole.count, batch)
        ranks = handle.call(CounterRole.rank_of, "x")
        expected = batch["prompt_mask"].sum(1)
        return NodeResult(
            out,
            {
                "echo/tokens": float(out["echo_tokens"].sum()),
                "echo/matches": float(torch.equal(out["echo_tokens"], expected)),
                "echo/workers": float(len(ranks)),
                "echo/step": float(runtime.step),
            },
        )
