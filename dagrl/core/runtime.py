"""What nodes see while they run: the typed config, role handles, tokenizer, rewards, the step."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass
class Runtime:
    """The services a node's `run` may use: the typed config, a handle per role (`role(name)`),
    the tokenizer, the reward composer, and this step's number (`at_step` makes the per-step view;
    the scheduler's per-node view, `at_node`, also binds the handles to the run's data ledger)."""

    cfg: object  # DagrlConfig
    roles: dict = field(default_factory=dict)  # role -> RoleHandle
    tokenizer: object = None
    rewarder: object = None  # RewardComposer
    step: int = 0  # set per step by `at_step`; the shared runtime is never changed
    sample_round: int = 0  # dynamic sampling: which of the step's rollouts this is (its seed)
    data: object = None  # residency.StepData of the run in progress (at_node)
    node: str | None = None  # the node this view runs (at_node)

    def at_step(self, step: int, sample_round: int = 0) -> Runtime:
        """The view nodes of one step see: the same roles and services, that step's number (and,
        when dynamic sampling draws more prompts for it, the round)."""
        return replace(self, step=step, sample_round=sample_round)

    def at_node(self, node: str, data) -> Runtime:
        """The view node `node` of a run sees: its calls count driver bytes and keep what the
        run's plan leaves on the workers (dagrl/core/residency.py)."""
        return replace(self, node=node, data=data)

    def role(self, name: str):
        handle = self.roles[name]
        return handle if self.data is None else handle.bound(self.data, self.node)
