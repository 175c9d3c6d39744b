"""What the backends' memory estimates share: the workload of one forward and the parts a role
keeps on a device.

Each backend estimates its own footprint in its own module (backends/torch/memory.py,
backends/megatron/memory.py, backends/vllm/memory.py, backends/hf/memory.py) as pure functions of
the model's shape, the role's spec and a `Workload`; dagrl/trainer/memory_plan.py adds up what
every colocated role keeps on a device in each phase of a step. All figures are bytes per device.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class Workload:
    """One forward on one device: `rows` sequences of `seq` tokens each (prompt + response, as the
    backend lays them out), the last `response` of which are scored. `micro_batches`: how many such
    forwards one optimizer step runs on this device (pipeline schedules keep several in flight)."""

    rows: int
    seq: int
    response: int
    micro_batches: int = 1

    @property
    def tokens(self) -> int:
        return self.rows * self.seq


def parts_total(parts: dict[str, float]) -> float:
    return float(sum(parts.values()))
