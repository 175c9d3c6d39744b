"""The step loop: data → DAG → log → maybe validate / save. Setup lives in dagrl/trainer/setup.py."""

from __future__ import annotations

import os
import time

import torch
from tqdm import tqdm

from dagrl.backends.handles import critic_role, train_role
from dagrl.backends.update_loop import NONFINITE_GRADS, NONFINITE_LOSSES
from dagrl.config.roles import Role
from dagrl.core.batch import Batch, left_pad, right_pad
from dagrl.core.failures import phase
from dagrl.errors import NonFiniteError
from dagrl.rewards.composer import NONFINITE_REWARDS
from dagrl.trainer import checkpoint, interrupt
from dagrl.trainer.dynamic_sampling import GroupFilter
from dagrl.trainer.logger import MetricsLogger, log
from dagrl.trainer.overlap import RolloutAhead

GRPO_SOURCE = ("prompts", "prompt_mask", "group_ids", "data_source", "ground_truth", "extra_info")


def collate(
    examples, pad_id: int, n: int, first_group: int, source=GRPO_SOURCE, response_width: int = 0
) -> Batch:
    """The DAG's `source` keys from the rows; each row repeated n times (rows i*n..i*n+n-1 form group i).

    Prompts (and teacher prompts) are left-padded; a row without a teacher prompt gets its own
    prompt there (its teacher reads what the student reads: plain GKD for that row). Reference
    responses are right-padded (cut) to `response_width`; rows without one get an empty mask.
    """
    tensors, meta = {}, {}
    if {"prompts", "prompt_mask"} & set(source):
        tensors["prompts"], tensors["prompt_mask"] = left_pad([e.prompt_ids for e in examples], pad_id)
    if {"teacher_prompts", "teacher_prompt_mask"} & set(source):
        tensors["teacher_prompts"], tensors["teacher_prompt_mask"] = left_pad(
            [e.teacher_prompt_ids or e.prompt_ids for e in examples], pad_id
        )
    if {"dataset_responses", "dataset_response_mask"} & set(source):
        assert response_width > 0, "reference responses need the response width"
        tensors["dataset_responses"], tensors["dataset_response_mask"] = right_pad(
            [e.response_ids or [] for e in examples], pad_id, response_width
        )
    if "dataset_loss_mask" in source:  # SFT: the tokens trained (assistant turns), else every one
        tensors["dataset_loss_mask"], _ = right_pad(
            [e.response_loss_mask or [1] * len(e.response_ids or []) for e in examples], 0, response_width
        )
    if "group_ids" in source:
        tensors["group_ids"] = torch.arange(first_group, first_group + len(examples))
    for key in ("data_source", "ground_truth", "extra_info"):
        if key in source:
            meta[key] = [getattr(e, key) for e in examples]
    return Batch(tensors, meta).select(list(source)).repeat_interleave(n)


def run_config(cfg) -> dict:
    """The typed config as plain values (the run's config in wandb)."""
    import dataclasses
    import json

    return json.loads(json.dumps(dataclasses.asdict(cfg), default=lambda v: getattr(v, "value", str(v))))


class Trainer:
    def __init__(self, cfg, runtime, scheduler, train_loader, val_dataset, out_dir: str, validators=None):
        """validators: the validation DAG's schedulers (before the first update, after it)."""
        self.cfg, self.runtime, self.scheduler, self.validators = cfg, runtime, scheduler, validators
        self.loader, self.val_dataset = train_loader, val_dataset
        self.ckpt_root = os.path.expanduser(cfg.trainer.default_local_dir)
        self.out_dir = out_dir
        self.metrics: MetricsLogger | None = None  # opened in fit, once resume has set the first step
        self.step = 0
        self.saved_step = 0  # the step of the last checkpoint written or resumed from
        self.skipped_steps = self.skipped_in_a_row = 0  # steps whose update was not applied
        t = cfg.trainer
        by_epochs = t.total_epochs * train_loader.steps_per_epoch
        self.total_steps = min(by_epochs, t.total_training_steps) if t.total_training_steps else by_epochs
        overlap = cfg.actor_rollout_ref.rollout.overlap_steps
        self.ahead = RolloutAhead(scheduler, Role.rollout) if overlap else None
        refill = cfg.algorithm.filter_groups.enable  # DAPO's dynamic sampling (refused with overlap)
        self.refill = GroupFilter(cfg, scheduler, runtime.tokenizer.pad_token_id) if refill else None

    def fit(self) -> dict[str, float]:
        self.maybe_resume()
        t = self.cfg.trainer
        loggers = [getattr(x, "value", x) for x in t.logger]
        self.metrics = MetricsLogger(
            self.out_dir, loggers, t.experiment_name, t.project_name, self.step, run_config(self.cfg)
        )
        if t.val_only:  # verl's trainer.val_only: the current weights scored once, no step taken
            return self.validate_only()
        last: dict[str, float] = {}
        if t.val_before_train and self.step == 0 and self.val_dataset is not None:
            with phase("validation"):
                last = self.validate()
            self.metrics.write(0, last)
        bar = tqdm(
            total=self.total_steps, initial=self.step, disable=not t.progress_bar, desc="train", leave=False
        )
        while self.step < self.total_steps:
            interrupt.stop_if_requested(self)  # Ctrl-C / SIGTERM: stop here, between steps, saved
            self.step += 1
            started = time.perf_counter()
            with phase(f"step {self.step}"):  # an error of any phase: one line naming it (failures.py)
                if self.refill is not None:
                    metrics = self.refill.step(self.step, self.next_batch)
                elif self.ahead is None:
                    _, metrics = self.scheduler.run(self.next_batch(self.step), step=self.step)
                else:
                    metrics = self.overlapped_step()
            metrics["train/epoch"] = float(self.loader.epoch)
            for pool in {id(h.pool): h.pool for h in self.runtime.roles.values()}.values():
                metrics.update(pool.memory_report())  # memory/to_<role>/...: flat from step 2 on
            # the step as the user waits for it, validation and saving aside: with a rollout in
            # flight (overlap_steps=1) the rollout pool's report waits for it, which the DAG's own
            # wall time cannot see (it read 1.4 s a step where steps took 3 s on 2x H200)
            metrics["timing_s/step"] = time.perf_counter() - started
            self.count_skipped(metrics)  # before any save: a run of no-ops stops, unsaved
            is_last = self.step == self.total_steps
            if self.val_dataset is not None and t.test_freq > 0 and (self.step % t.test_freq == 0 or is_last):
                with phase(f"validation after step {self.step}"):
                    metrics.update(self.validate())
            if t.save_freq > 0 and (self.step % t.save_freq == 0 or is_last):
                with phase(f"saving step {self.step}", self.ckpt_root):
                    self.save()
            bar.update(1)
            bar.clear()
            self.metrics.write(self.step, metrics)
            last = metrics
        bar.close()
        self.metrics.close()
        if self.ahead is not None:
            self.ahead.close()
        return last

    def count_skipped(self, metrics: dict[str, float]) -> None:
        """A step whose update was skipped (non-finite gradient norm; the loss or a reward is
        usually the cause) is counted in train/skipped_steps and warned about; more than
        trainer.max_consecutive_skipped_steps of them in a row stop the run."""
        limit = self.cfg.trainer.max_consecutive_skipped_steps
        skipped = metrics.get(NONFINITE_GRADS, 0.0) > 0
        self.skipped_steps += skipped
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
        metrics["train/skipped_steps"] = float(self.skipped_steps)
        if not skipped:
            return
        causes = {"loss": NONFINITE_LOSSES, "gradient": NONFINITE_GRADS, "reward": NONFINITE_REWARDS}
        why = ", ".join(f"{what} ({metrics[k]:g})" for what, k in causes.items() if metrics.get(k, 0) > 0)
        log(
            f"warning: step {self.step}: {metrics[NONFINITE_GRADS]:g} update(s) skipped, non-finite {why};"
            f" {self.skipped_in_a_row} step(s) in a row (the run stops after"
            f" trainer.max_consecutive_skipped_steps={limit})"
        )
        if self.skipped_in_a_row > limit:
            last = (
                f"the last checkpoint is step {self.saved_step}" if self.saved_step else "nothing was saved"
            )
            raise NonFiniteError(
                f"stopped at step {self.step}: {self.skipped_in_a_row} steps in a row skipped their update for"
                f" a non-finite {why} (trainer.max_consecutive_skipped_steps={limit}); {last}. Check the"
                " warnings above (a reward returning NaN, a learning rate too high, fp16 overflow), fix it"
                " and run again"
            )

    def next_batch(self, step: int, first_group: int | None = None) -> Batch:
        """The loader's next prompts as the DAG's source keys; group ids from `first_group` on
        (default: unique over the run)."""
        examples = self.loader.next_batch()
        n, source = self.cfg.actor_rollout_ref.rollout.n, self.scheduler.dag.source
        width = self.cfg.data.max_response_length
        pad = self.runtime.tokenizer.pad_token_id
        first = (step - 1) * len(examples) if first_group is None else first_group
        return collate(examples, pad, n, first, source, response_width=width)

    def overlapped_step(self) -> dict[str, float]:
        """Train on this step's batch while the next one is sampled (trainer/overlap.py)."""
        current = None if self.ahead.pending is not None else self.next_batch(self.step)
        upcoming, state = None, None
        if self.step < self.total_steps:
            state = self.loader.state_dict()
            upcoming = self.next_batch(self.step + 1)
        return self.ahead.step(self.step, current, upcoming, state)

    def validate_only(self) -> dict[str, float]:
        """trainer.val_only: validate the weights the train role holds (a resumed checkpoint's, else
        the model's own), synced to the rollout engine first, and stop."""
        with phase("validation"):
            metrics = self.validate(sync=True)
        self.metrics.write(self.step, metrics)
        self.metrics.close()
        if self.ahead is not None:
            self.ahead.close()
        log(f"trainer.val_only: validated the weights of step {self.step}; no training step taken")
        return metrics

    def validate(self, sync: bool = False) -> dict[str, float]:
        """Run the validation DAG on the validation prompts (rollout.val_kwargs) and score them.
        The rollout engine gets the train role's weights first after an update, or when `sync`."""
        vk = self.cfg.actor_rollout_ref.rollout.val_kwargs
        scheduler = self.validators[1 if sync or self.step > 0 else 0]
        examples = [self.val_dataset[i] for i in range(len(self.val_dataset))]
        width = self.cfg.data.max_response_length
        pad = self.runtime.tokenizer.pad_token_id
        batch = collate(examples, pad, vk.n, 0, scheduler.dag.source, response_width=width)
        _, metrics = scheduler.run(batch, step=self.step)
        kept = ("reward/", "response_length/", "loss")  # loss: SFT's validation NLL (val_loss node)
        return {f"val/{k}": v for k, v in metrics.items() if k.startswith(kept)}

    # ---- checkpoints ---------------------------------------------------------------------------
    def save(self) -> str:
        """All ranks write into a staging dir; the driver seals it atomically (checkpoint.save)."""

        def write(staging: str) -> None:
            train_role(self.runtime, Role.train).save(os.path.join(staging, "actor"))
            if Role.critic in self.runtime.roles:  # PPO's value model: weights, optimizer, RNG
                critic_role(self.runtime, Role.critic).save(os.path.join(staging, "critic"))
            if self.cfg.trainer.save_hf:  # inside the staging dir: sealed with the checkpoint
                self.export_hf(os.path.join(staging, "actor_hf"))

        # the driver draws no random numbers (sampling seeds derive from the step); workers save theirs
        in_flight = self.ahead is not None and self.ahead.data_state is not None
        data = self.ahead.data_state if in_flight else self.loader.state_dict()  # not the batch in flight
        state = {"global_step": self.step, "data": data}
        t = self.cfg.trainer
        path = checkpoint.save(self.ckpt_root, self.step, write, state, t.max_actor_ckpt_to_keep)
        self.saved_step = self.step
        log(f"saved checkpoint {path}")
        return path

    def maybe_resume(self) -> None:
        path = checkpoint.pick(self.ckpt_root, self.cfg.trainer.resume_mode)  # verified against its manifest
        if path is None:
            return
        state = checkpoint.read_state(path)
        train_role(self.runtime, Role.train).load(os.path.join(path, "actor"))
        if Role.critic in self.runtime.roles:
            critic_role(self.runtime, Role.critic).load(os.path.join(path, "critic"))
        self.loader.load_state_dict(state["data"])
        self.step = self.saved_step = int(state["global_step"])
        log(f"resumed from {path} at step {self.step}")

    def export_hf(self, path: str) -> None:
        """A HF model directory of the current actor (every train worker takes part: megatron
        gathers its shards collectively; one rank writes)."""
        train_role(self.runtime, Role.train).export_hf(path)
