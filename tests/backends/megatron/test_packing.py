"""actor_rollout_ref.model.use_remove_padding on the megatron backend: packed rows (block-diagonal
mask, per-sequence rotary positions) give the torch backend's padded log-probs, loss, grad norm
and updated weights, under TP1 / TP2 (+SP) / PP2, on a batch of very different lengths.

Runs megatron-core's real code on CPU under gloo (tests/megatron_cpu_patch.py), fp32.
"""

from __future__ import annotations

import pytest
import torch

from tests.backends.megatron.test_backend import (
    COMMON,
    M,
    _check_against_reference,
    _logprobs_then_step,
    _torch_reference,
    make_batch,
    megatron_config,
)
from tests.conftest import compose_config
from tests.megatron_cpu_patch import run_distributed

pytest.importorskip("megatron.core")

PACK = "actor_rollout_ref.model.use_remove_padding=true"
ENTROPY = "actor_rollout_ref.actor.entropy_coeff=0.01"  # entropy in the loss: its gradient too
# 8 sequences per micro-batch: enough short ones to share rows (the reference runs micro-batches of 2)
MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"


@pytest.fixture(scope="module")
def reference():
    """The torch backend, padded, on prompts of 2..14 and responses of 1..20 tokens."""
    return _torch_reference(compose_config(*COMMON, ENTROPY), make_batch(prompt_len=14, resp_len=20, seed=3))


@pytest.mark.parametrize(
    "world,overrides",
    [
        (1, ()),
        (2, (f"{M}.tensor_model_parallel_size=2",)),
        (2, (f"{M}.tensor_model_parallel_size=2", f"{M}.sequence_parallel=true")),
        (2, (f"{M}.pipeline_model_parallel_size=2",)),
        (1, (f"{M}.layer_spec=local",)),
    ],
    ids=["tp1", "tp2", "tp2-sp", "pp2", "local-spec"],
)
def test_packed_matches_padded_torch_backend(reference, world, overrides):
    batch, _ = reference
    cfg = megatron_config(PACK, ENTROPY, MICRO, *overrides)
    results = run_distributed(_logprobs_then_step, world, cfg, batch)
    _check_against_reference(results, reference)
    metrics = next(r["metrics"] for r in results if r["returns"])
    assert 0 <= metrics["perf/packed_pad_fraction"] < metrics["perf/pad_fraction"]


def _rotary_by_position(rank: int, world: int, cfg):
    """A packed row's second sequence rotated by its position ids, not its columns."""
    from tests.backends.megatron.test_backend import _backend

    backend = _backend(cfg, rank, world, forward_only=True)
    model = backend.model[0]
    captured = {}
    model.decoder.register_forward_pre_hook(
        lambda _, args, kwargs: captured.update(rotary=kwargs["rotary_pos_emb"]), with_kwargs=True
    )
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    positions = torch.tensor([[0, 1, 2, 0, 1]])
    model(input_ids=ids, position_ids=positions, attention_mask=None, labels=ids, rope_from_position_ids=True)
    packed = captured["rotary"]  # [S, B, 1, dim]
    model(input_ids=ids, position_ids=positions, attention_mask=None, labels=ids)
    by_column = captured["rotary"]  # [S, 1, 1, dim]
    return packed, by_column


def test_rotary_follows_position_ids_only_when_asked():
    packed, by_column = run_distributed(_rotary_by_position, 1, megatron_config())[0]
    assert packed.shape[:3] == (5, 1, 1) and by_column.shape[:3] == (5, 1, 1)
    torch.testing.assert_close(packed[[0, 1, 2, 3, 4], 0], by_column[[0, 1, 2, 0, 1], 0])
    assert not torch.equal(packed[3], by_column[3])
