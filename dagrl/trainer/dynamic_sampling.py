"""DAPO's dynamic sampling (`algorithm.filter_groups.enable`): a step trains on full groups only.

The step's DAG is cut in two and run with the scheduler's partial runs, so each part stays a DAG
and nothing in it loops:

    round r = 0, 1, ...:  draw data.train_batch_size prompts ──> run `sample` nodes (weight_sync
                          on round 0, rollout, rm, reward: the reward node and what it depends on)
                          ──> keep the groups whose metric varies (algos/dapo.py: varied_groups)
                          until data.train_batch_size groups are kept or
                          filter_groups.max_num_gen_batches rounds were drawn
    then:                 run the other nodes (log-probs, advantage, update) once, on the first
                          data.train_batch_size kept groups

Why here and not in a node: the number of rounds is only known after each reward, and a DAG node
that sampled again would be a loop inside the step (a rollout feeding a filter feeding the
rollout). The trainer owns the data loader, so drawing more prompts is its job; the scheduler
runs what it is given. Rounds after the first sample with seeds of their own
(`nodes/rollout.py: step_seed`) and skip the weight sync (the engine still holds this step's
weights) unless another role of the sampling part shares the rollout's workers (a colocated
reward model: handing the devices to it may drop an engine's weights, sleep_level 2).

A step that reaches the cap short of groups is filled with dropped groups (advantage 0 under a
group baseline) and warned about; verl stops the run there instead.
"""

from __future__ import annotations

import torch

from dagrl.algos.dapo import overlong_penalty, varied_groups
from dagrl.config.enums import FilterMetric
from dagrl.console import log
from dagrl.core.batch import Batch

_SUMMED = ("timing_s/", "perf/")  # per-round figures that add up; the others are averaged
_LEFT_PADDED = ("prompts", "prompt_mask", "teacher_prompts", "teacher_prompt_mask")


def sampling_nodes(dag) -> set[str]:
    """The reward node and every node it depends on (directly or not): what a round re-runs."""
    todo = [s.name for s in dag.nodes if s.kind == "reward"]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(dag.deps[name])
    return seen


class GroupFilter:
    """Runs one training step with dynamic sampling (see the module docstring)."""

    def __init__(self, cfg, scheduler, pad_id: int):
        self.scheduler, self.pad_id = scheduler, pad_id
        self.filter = cfg.algorithm.filter_groups
        self.overlong, self.max_response = cfg.reward.overlong_buffer, cfg.data.max_response_length
        self.groups = cfg.data.train_batch_size
        self.rows = self.groups * cfg.actor_rollout_ref.rollout.n
        dag = scheduler.dag
        self.sample = sampling_nodes(dag)
        self.train = {s.name for s in dag.nodes} - self.sample
        sync = {s.name for s in dag.nodes if s.kind == "weight_sync"}
        self.resample = self.sample if self._engine_shares_devices() else self.sample - sync

    def _engine_shares_devices(self) -> bool:
        """Whether a remote node of the sampling part other than the rollout runs on the rollout's
        workers (then the engine is put to sleep between rounds and is synced again)."""
        dag, roles = self.scheduler.dag, self.scheduler.runtime.roles
        rollout = [roles[s.role].pool for s in dag.nodes if s.kind == "rollout" and s.role in roles]
        others = [
            roles[s.role].pool
            for s in dag.nodes
            if s.name in self.sample and s.role in roles and s.kind not in ("rollout", "weight_sync")
        ]
        return any(p is q for p in rollout for q in others)

    def step(self, step: int, draw) -> dict[str, float]:
        """Train step `step`; `draw(step, first_group)` collates the loader's next prompts with
        group ids from `first_group` on."""
        kept, dropped, rounds, per_round = [], [], 0, []
        groups_kept = groups_drawn = 0
        cap = self.filter.max_num_gen_batches
        while groups_kept < self.groups and (cap == 0 or rounds < cap):
            batch = draw(step, first_group=rounds * self.groups)
            nodes = self.sample if rounds == 0 else self.resample
            rolled, metrics = self.scheduler.run(batch, step, only=nodes, sample_round=rounds)
            rolled = rolled.materialized()
            keep = varied_groups(self.metric(rolled), rolled["group_ids"])
            kept.append(rolled.index(keep.nonzero().flatten()))
            dropped.append(rolled.index((~keep).nonzero().flatten()))
            groups_kept += int(kept[-1]["group_ids"].unique().numel())
            groups_drawn += int(rolled["group_ids"].unique().numel())
            per_round.append(metrics)
            rounds += 1
        refilled = 0
        if groups_kept < self.groups:
            refilled = self.groups - groups_kept
            log(
                f"warning: step {step}: {groups_kept} of {self.groups} groups varied after {rounds} rounds"
                f" (algorithm.filter_groups.max_num_gen_batches={cap}); {refilled} groups of equal reward fill"
                " the batch (advantage 0). The data may be too easy or too hard for the model: raise the cap"
            )
            kept += dropped
        batch = concat_rows(kept, self.pad_id).index(range(self.rows))
        _, train_metrics = self.scheduler.run(batch, step, only=self.train)
        metrics = merge_rounds([*per_round, train_metrics])
        metrics.update(
            {
                "dynamic_sampling/rounds": float(rounds),
                "dynamic_sampling/groups_drawn": float(groups_drawn),
                "dynamic_sampling/groups_kept": float(groups_kept),
                "dynamic_sampling/groups_refilled": float(refilled),
            }
        )
        return metrics

    def metric(self, batch: Batch) -> torch.Tensor:
        """[B] what a group is compared on (algorithm.filter_groups.metric)."""
        scores = batch["scores"].float()
        if self.filter.metric in (FilterMetric.acc, FilterMetric.score) or not self.overlong.enable:
            return scores
        lengths = batch["response_mask"].sum(1)
        return scores + overlong_penalty(
            lengths, self.max_response, self.overlong.len, self.overlong.penalty_factor
        )


def concat_rows(batches: list[Batch], pad_id: int) -> Batch:
    """Rows of batches sampled in different rounds: their prompts were left-padded to each round's
    longest, so they are padded to the longest of all first (responses have a fixed width)."""
    batches = [b for b in batches if len(b)]
    widths = {k: max(b[k].shape[1] for b in batches) for k in _LEFT_PADDED if k in batches[0].tensors}
    padded = []
    for b in batches:
        tensors = dict(b.tensors)
        for key, width in widths.items():
            value = pad_id if key.endswith("prompts") else 0
            tensors[key] = torch.nn.functional.pad(
                tensors[key], (width - tensors[key].shape[1], 0), value=value
            )
        padded.append(Batch(tensors, b.meta))
    return Batch.concat(padded)


def merge_rounds(per_round: list[dict[str, float]]) -> dict[str, float]:
    """The partial runs' metrics as one step's: seconds and bytes summed, the others averaged
    (the reward's over the rounds)."""
    keys = {k for m in per_round for k in m}
    merged = {}
    for key in keys:
        values = [m[key] for m in per_round if key in m]
        merged[key] = sum(values) if key.startswith(_SUMMED) else sum(values) / len(values)
    return merged
