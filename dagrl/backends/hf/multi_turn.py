"""The hf backend's Sampler for multi-turn episodes: every ready request of a turn in one batch.

Turn-synchronous (the episode loop hands over all ready requests at once, in episode order) and
drawn from one generator seeded per step, so a resumed run samples what the original would. On
CPU nothing idles while tools run, so continuous batching would buy nothing here.
"""

from __future__ import annotations

import torch

from dagrl.core.batch import Batch, left_pad
from dagrl.rollout.episodes import Sample


class HFTurnSampler:
    turn_synchronous = True

    def __init__(self, backend, gen: torch.Generator, sampling: tuple, micro_batch: int):
        self.backend, self.gen, self.sampling, self.micro_batch = backend, gen, sampling, micro_batch
        self.pending: list[tuple[int, list[int], int]] = []

    def submit(self, key: int, context: list[int], max_tokens: int) -> None:
        self.pending.append((key, context, max_tokens))

    def in_flight(self) -> int:
        return len(self.pending)

    def poll(self) -> list[Sample]:
        pending, self.pending = self.pending, []
        samples = []
        for start in range(0, len(pending), self.micro_batch):
            part = pending[start : start + self.micro_batch]
            ids, mask = left_pad([ctx for _, ctx, _ in part], self.backend.pad_id)
            longest = max(n for _, _, n in part)
            mb = Batch({"prompts": ids, "prompt_mask": mask})
            tokens, alive, logps = self.backend._generate(mb, self.gen, *self.sampling, max_new=longest)
            for row, (key, _, max_tokens) in enumerate(part):
                n = min(int(alive[row].sum()), max_tokens)  # a row may stop before the batch does
                samples.append(Sample(key, tokens[row, :n].tolist(), logps[row, :n].tolist()))
        return samples
