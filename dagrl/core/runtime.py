"""What nodes see while they run: the typed config, role handles, tokenizer, rewards, the step."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass
class Runtime:
    """The services a node's `run` may use: the typed config, a handle per role (`role(name)`),
    the tokenizer, the reward composer, and this step's number (`at_step` makes the per-step view)."""

    cfg: object  # DagrlConfig
    roles: dict = field(default_factory=dict)  # role -> RoleHandle
    tokenizer: object = None
    rewarder: object = None  # RewardComposer
    step: int = 0  # set per step by `at_step`; the shared runtime is never changed

    def at_step(self, step: int) -> Runtime:
        """The view nodes of one step see: the same roles and services, that step's number."""
        return replace(self, step=step)

    def role(self, name: str):
        return self.roles[name]
