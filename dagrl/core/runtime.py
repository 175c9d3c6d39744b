"""What nodes see while they run: the typed config, role handles, tokenizer, rewards, the step."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Runtime:
    cfg: object  # DagrlConfig
    roles: dict = field(default_factory=dict)  # role -> RoleHandle
    tokenizer: object = None
    rewarder: object = None  # RewardComposer
    step: int = 0

    def role(self, name: str):
        return self.roles[name]

    def colocated(self, a: str, b: str) -> bool:
        return self.roles[a].pool is self.roles[b].pool
