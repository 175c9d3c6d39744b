"""The shared update loop: LR schedule, epochs × mini-batches, and micro-batch weights that make the
accumulated gradient the mini-batch's, for every registered objective (torch backend, tiny model)."""

from __future__ import annotations

import pytest
import torch

from dagrl.backends.update_loop import lr_at, run_update
from dagrl.config.schema import OptimConfig
from dagrl.core.batch import Batch
from tests.conftest import compose_config
from tests.train_backends import train_backend

SMALL = (
    "data.train_batch_size=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
)


def test_lr_warms_up_linearly_then_stays():
    optim = OptimConfig(lr=1.0, lr_warmup_steps=4)
    assert [lr_at(optim, s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_at(OptimConfig(lr=2e-4, lr_warmup_steps=0), 0) == 2e-4


def torch_backend(*overrides: str):
    from dagrl.backends.torch.train import TorchTrainBackend
    from dagrl.config.validate import resolve_defaults
    from dagrl.core.worker import ParallelContext

    cfg = compose_config(*SMALL, *overrides)
    resolve_defaults(cfg)
    return train_backend(TorchTrainBackend, cfg, ParallelContext(0, 1, torch.device("cpu")))


def make_batch(backend, rows: int = 8) -> Batch:
    """Responses of 1..5 tokens (so token and row shares differ), old log-probs off-policy."""
    g = torch.Generator().manual_seed(0)
    resp_lens = torch.tensor([1, 5, 2, 4, 3, 5, 1, 2])[:rows]
    response_mask = (torch.arange(5)[None] < resp_lens[:, None]).long()
    batch = Batch(
        {
            "prompts": torch.randint(5, 60, (rows, 6), generator=g),
            "prompt_mask": torch.ones(rows, 6, dtype=torch.long),
            "responses": torch.randint(5, 60, (rows, 5), generator=g) * response_mask,
            "response_mask": response_mask,
            "advantages": torch.randn(rows, 1, generator=g).expand(rows, 5) * response_mask,
        }
    )
    current, _ = backend.forward_logprobs(batch, "old_logprobs")
    noise = 0.05 * torch.randn(rows, 5, generator=g)
    rollout = current["old_logprobs"] + 0.05 * torch.randn(rows, 5, generator=g)  # the engine's view
    return batch.union(Batch({"old_logprobs": current["old_logprobs"] + noise, "rollout_logprobs": rollout}))


def accumulated_grads(backend, mini: Batch, micro_rows: int) -> list[torch.Tensor]:
    micro_batches = mini.chunks(micro_rows)
    backend.forward_backward(micro_batches, backend.objective.micro_batch_weights(mini, micro_batches))
    return [p.grad.clone() for p in backend.model.parameters()]


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "gspo"])
def test_micro_batches_accumulate_the_mini_batch_gradient(preset):
    backend = torch_backend(f"algorithm={preset}", "actor_rollout_ref.actor.entropy_coeff=0.01")
    backend.model.train()
    mini = make_batch(backend)
    whole = accumulated_grads(backend, mini, micro_rows=8)
    for rows in (1, 3):  # equal and unequal micro-batches
        split = accumulated_grads(backend, mini, micro_rows=rows)
        for a, b in zip(whole, split):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in whole)


def test_epochs_times_mini_batches_optimizer_steps():
    # 8 rows, mini-batches of 1 prompt × 4 = 4 rows, 2 epochs: 4 optimizer steps, lr of step 0
    backend = torch_backend("actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.shuffle=true")
    batch = make_batch(backend)
    actor = backend.settings.update  # the spec's update section: actor_rollout_ref.actor
    actor.ppo_mini_batch_size = 1
    metrics = run_update(
        backend, backend.objective, batch, backend.settings, backend.spec.seed, dp_size=1, step=0
    )
    steps = {int(s["step"]) for s in backend.optimizer.state.values()}
    assert steps == {4}
    optim = actor.optim
    assert metrics["actor/lr"] == optim.lr / optim.lr_warmup_steps
    assert backend.optimizer.param_groups[0]["lr"] == metrics["actor/lr"]
    assert {"actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac"} <= set(metrics)


BUDGET = (
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20",
)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_token_budget_update_equals_the_fixed_micro_batch_update(mode):
    """Micro-batches cut to 20 tokens (verl's use_dynamic_bsz) give the loss, gradient norm and
    updated weights of fixed micro-batches of 3 rows, to fp32 rounding; no micro-batch holds more
    than 20 real tokens unless it is a single row."""
    agg = f"actor_rollout_ref.actor.loss_agg_mode={mode}"
    fixed = torch_backend(agg, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3")
    budget = torch_backend(agg, *BUDGET)
    batch = make_batch(fixed)
    seen: list[int] = []
    forward_backward = budget.forward_backward

    def spy(micro_batches, weights):
        seen.extend(int(mb["prompt_mask"].sum() + mb["response_mask"].sum()) for mb in micro_batches)
        assert all(n <= 20 or len(mb) == 1 for n, mb in zip(seen[-len(micro_batches) :], micro_batches))
        return forward_backward(micro_batches, weights)

    budget.forward_backward = spy
    _, want = fixed.train_step(batch)
    _, got = budget.train_step(batch)
    assert len(seen) > 2 and sum(seen) == int(batch["prompt_mask"].sum() + batch["response_mask"].sum())
    assert got["actor/pg_loss"] == pytest.approx(want["actor/pg_loss"], rel=1e-5, abs=1e-7)
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-5)
    for a, b in zip(fixed.model.parameters(), budget.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_token_budget_log_probs_equal_fixed_micro_batches():
    fixed = torch_backend("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3")
    budget = torch_backend(
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=15",
    )
    batch = make_batch(fixed).select(("prompts", "prompt_mask", "responses", "response_mask"))
    want = fixed.forward_logprobs(batch, "old_logprobs")[0]["old_logprobs"]
    got = budget.forward_logprobs(batch, "old_logprobs")[0]["old_logprobs"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # fp32 rounding of other shapes
