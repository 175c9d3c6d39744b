"""weight_sync: the actor's weights into the rollout engine, as a node of the step.

The copy itself is the weight-sync service (dagrl/backends/weight_sync.py): in process and staged
when the roles are colocated, a broadcast from train rank 0 in buckets when they are separate.
"""

from __future__ import annotations

from dagrl.backends.weight_sync import sync_weights
from dagrl.config.roles import Role
from dagrl.core.batch import Batch
from dagrl.core.node import NodeResult, register_node_kind


@register_node_kind("weight_sync")
class WeightSyncNode:
    required_inputs = ()
    optional_inputs = ()
    outputs = ()
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        dst = self.spec.role
        return NodeResult(Batch(), sync_weights(runtime.role(Role.train), runtime.role(dst)))
