"""Rollout one step ahead (`actor_rollout_ref.rollout.overlap_steps=1`, separate placement).

Step t, with θ the weights after step t-1's update:
    weight_sync(θ) ──> rollout(batch t+1) ───────────────────────────┐  rollout pool, in background
                   └─> reward, log-probs, advantage, update(batch t)  │  train pool
    step t+1 starts when both are done; batch t+1 was sampled with θ and trains at θ' (one update
    later): `rollout/staleness` = 1. The first step after start or resume generates its own batch
    first (staleness 0).

The sync runs before the background rollout and before the update, so the engine always receives
whole weights of one version. A checkpoint taken while a batch is in flight records the data
position before it: after resume that batch is sampled again, with the resumed weights.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from dagrl.core.batch import Batch
from dagrl.core.residency import BYTE_COUNTERS


class RolloutAhead:
    def __init__(self, scheduler, rollout_role: str):
        nodes = scheduler.dag.nodes
        self.sync = {s.name for s in nodes if s.kind == "weight_sync"}
        self.generate = {s.name for s in nodes if s.role == rollout_role and s.name not in self.sync}
        self.train = {s.name for s in nodes} - self.sync - self.generate
        self.scheduler = scheduler
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dagrl-rollout-ahead")
        self.pending: Future | None = None
        self.data_state: dict | None = None  # the loader's position before the batch in flight

    def step(
        self, step: int, current: Batch | None, next_batch: Batch | None, data_state: dict | None
    ) -> dict[str, float]:
        """Train step `step` on `current` (sampled one step ago, or now if nothing is in flight)
        while `next_batch` is sampled; `data_state`: the loader's position before `next_batch`."""
        run = self.scheduler.run
        _, metrics = run(Batch(), step, only=self.sync)
        if self.pending is None:
            rolled, gen_metrics = run(current, step, only=self.generate)
            staleness = 0.0
        else:
            rolled, gen_metrics = self.pending.result()
            staleness = 1.0
        self.pending, self.data_state = None, None
        if next_batch is not None:
            # the background rollout belongs to step + 1: its sampling seed must say so
            self.pending = self.executor.submit(run, next_batch, step + 1, self.generate)
            self.data_state = data_state
        _, train_metrics = run(rolled, step, only=self.train)
        parts = (metrics, gen_metrics, train_metrics)
        bytes_moved = {k: sum(m.get(k, 0.0) for m in parts) for k in BYTE_COUNTERS}
        metrics.update(gen_metrics)
        metrics.update(train_metrics)
        metrics.update(bytes_moved)  # the three runs' together (the background one: the step it samples for)
        metrics["rollout/staleness"] = staleness
        return metrics

    def close(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
        self.executor.shutdown(wait=True)
