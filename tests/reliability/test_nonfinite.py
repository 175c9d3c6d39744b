"""No silent wrong training: greedy rollouts (temperature 0) train on finite log-probs, and an update
on non-finite gradients is skipped, counted, warned about and, too many in a row, stops the run."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from dagrl.backends.update_loop import NONFINITE_GRADS, NONFINITE_LOSSES, run_update
from dagrl.core.batch import Batch
from dagrl.errors import DataError, NonFiniteError
from tests.backends.test_update_loop import make_batch, torch_backend
from tests.conftest import compose_config


def with_nan_advantages(batch: Batch) -> Batch:
    keep = batch.select([k for k in batch.keys() if k != "advantages"])
    return keep.union(Batch({"advantages": torch.full_like(batch["advantages"], math.nan)}))


def _weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_greedy_rollout_trains_on_finite_logprobs():
    """temperature=0: the trainer scores at temperature 1 (no division by zero) and the update applies."""
    backend = torch_backend("actor_rollout_ref.rollout.temperature=0")
    assert backend.temperature == 1.0
    batch = make_batch(backend)
    assert torch.isfinite(batch["old_logprobs"]).all()
    before = _weights(backend.model)
    metrics = run_update(
        backend, backend.objective, batch, backend.settings, backend.spec.seed, dp_size=1, step=0
    )
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics[NONFINITE_GRADS] == 0 and metrics[NONFINITE_LOSSES] == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, backend.model.parameters()))


def test_greedy_sampling_is_argmax_with_temperature_one_logprobs():
    from dagrl.backends.hf.rollout import _sample

    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]])
    token, logp = _sample(logits, torch.Generator().manual_seed(0), 0.0, 1.0, -1, greedy=True)
    assert token.tolist() == [1, 0]
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])


def test_nan_advantages_skip_the_update_torch():
    backend = torch_backend()
    batch = make_batch(backend)
    batch = with_nan_advantages(batch)
    before = _weights(backend.model)
    metrics = run_update(
        backend, backend.objective, batch, backend.settings, backend.spec.seed, dp_size=1, step=0
    )
    # 8 rows, mini-batches of 2 prompts × 4 = 8 rows: one update, skipped
    assert metrics[NONFINITE_GRADS] == 1 and metrics[NONFINITE_LOSSES] == 1
    assert math.isnan(metrics["actor/grad_norm"])
    assert all(torch.equal(a, b) for a, b in zip(before, backend.model.parameters()))
    # AdamW never stepped: its moments (made with the optimizer) are still zeros, at step 0
    states = list(backend.optimizer.state.values())
    assert states and all(int(st["step"]) == 0 for st in states)
    assert all(not st["exp_avg"].any() and not st["exp_avg_sq"].any() for st in states)


def _nan_update_megatron(rank: int, world: int, cfg, batch):
    from tests.backends.megatron.test_backend import _backend

    backend = _backend(cfg, rank, world)
    before = {k: v.clone() for b in backend.export_weights(to_cpu=True) for k, v in b.items()}
    _, metrics = backend.train_step(batch)
    after = {k: v.clone() for b in backend.export_weights(to_cpu=True) for k, v in b.items()}
    return metrics, all(torch.equal(before[k], after[k]) for k in before)


def test_nan_advantages_skip_the_update_megatron():
    """megatron checks inf/NaN only under fp16's loss scaler; dagrl checks the global norm first."""
    pytest.importorskip("megatron.core")
    from tests.backends.megatron.test_backend import make_batch as megatron_batch
    from tests.backends.megatron.test_backend import megatron_config
    from tests.megatron_cpu_patch import run_distributed

    batch = megatron_batch()
    batch = with_nan_advantages(batch)
    [(metrics, unchanged)] = run_distributed(_nan_update_megatron, 1, megatron_config(), batch)
    assert unchanged
    assert metrics[NONFINITE_GRADS] == 1 and math.isnan(metrics["actor/grad_norm"])


def _trainer(limit: int):
    from dagrl.trainer.loop import Trainer

    cfg = compose_config(f"trainer.max_consecutive_skipped_steps={limit}")
    state = SimpleNamespace(cfg=cfg, step=0, saved_step=0, skipped_steps=0, skipped_in_a_row=0)
    return state, lambda metrics: Trainer.count_skipped(state, metrics)


def test_skipped_steps_are_counted_warned_and_stop_the_run(capsys):
    state, count = _trainer(limit=2)
    pattern = [1, 0, 1, 1]  # skipped, applied, then two in a row: at the limit, not over it
    for step, skipped in enumerate(pattern, 1):
        state.step = step
        metrics = {NONFINITE_GRADS: float(skipped), NONFINITE_LOSSES: float(skipped)}
        count(metrics)
        assert metrics["train/skipped_steps"] == sum(pattern[:step])
    out = capsys.readouterr().out
    assert (
        "warning: step 4: 1 update(s) skipped, non-finite loss (1), gradient (1); 2 step(s) in a row" in out
    )
    state.step = 5
    with pytest.raises(NonFiniteError, match=r"stopped at step 5: 3 steps in a row .*nothing was saved"):
        count({NONFINITE_GRADS: 1.0, "train/nonfinite_rewards": 4.0})


def test_raising_reward_names_the_row_and_the_error():
    from dagrl.rewards import RewardComposer, RewardTerm, register_reward

    @register_reward("test_raises_on_b")
    def raises_on_b(solution, truth, extra):
        if solution == "b":
            raise ZeroDivisionError("division by zero")
        return 1.0

    composer = RewardComposer([RewardTerm("test_raises_on_b")])
    with pytest.raises(DataError) as err:
        composer.score_batch(["src", "src"], ["a", "b"], ["1", "1"], [{"index": 40}, {"index": 41}])
    msg = str(err.value)
    assert "batch row 1 (extra_info.index=41)" in msg and "'src'" in msg and "ZeroDivisionError" in msg
    assert isinstance(err.value.__cause__, ZeroDivisionError)


def test_nonfinite_rewards_are_named():
    from dagrl.rewards.composer import nonfinite_rows

    assert nonfinite_rows([1.0, 0.0], ["a", "a"], [{}, {}]) is None
    text = nonfinite_rows([1.0, math.nan, math.inf], ["a", "b", "c"], [{}, {"index": 7}, None])
    assert (
        text
        == "2 of 3 responses: data_source 'b' batch row 1 (extra_info.index=7) = nan, data_source 'c' batch row 2 = inf"
    )
