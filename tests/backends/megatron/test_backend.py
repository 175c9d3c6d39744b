"""The megatron backend against the torch backend and against itself under TP2 / PP2 / DP2, and
the per-card memory figures each DP replica's ranks gather for the one rank the driver keeps.

Everything runs megatron-core's real code on CPU under gloo (tests/megatron_cpu_patch.py) on the
tiny model that ships with dagrl, in fp32, so parallel layouts must agree to fp32 rounding.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import compose_config
from tests.megatron_cpu_patch import run_distributed
from tests.train_backends import train_backend

pytest.importorskip("megatron.core")

M = "actor_rollout_ref.actor.megatron"
COMMON = (
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=1",
    # Adam's first step is ~lr * g / (|g| + eps): with the default 1e-8 a gradient that is
    # rounding noise (e.g. k_proj's bias, whose true gradient is 0) still moves by a full lr
    "actor_rollout_ref.actor.optim.eps=1e-5",
    "actor_rollout_ref.rollout.n=4",
    "data.train_batch_size=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
    "trainer.device=cpu",
)


def megatron_config(*overrides: str):
    return compose_config(
        *COMMON, "actor_rollout_ref.actor.strategy=megatron", f"{M}.param_dtype=float32", *overrides
    )


def make_batch(rows: int = 8, prompt_len: int = 6, resp_len: int = 5, vocab: int = 261, seed: int = 0):
    """Left-padded prompts, right-padded responses of varied lengths, random advantages."""
    from dagrl.core.batch import Batch

    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(2, prompt_len + 1, (rows,), generator=g)
    resp_lens = torch.randint(1, resp_len + 1, (rows,), generator=g)
    prompt_mask = (torch.arange(prompt_len)[None] >= prompt_len - prompt_lens[:, None]).long()
    response_mask = (torch.arange(resp_len)[None] < resp_lens[:, None]).long()
    prompts = torch.randint(2, vocab, (rows, prompt_len), generator=g) * prompt_mask
    responses = torch.randint(2, vocab, (rows, resp_len), generator=g) * response_mask
    return Batch(
        {
            "prompts": prompts,
            "prompt_mask": prompt_mask,
            "responses": responses,
            "response_mask": response_mask,
            "advantages": torch.randn(rows, resp_len, generator=g) * response_mask,
        }
    )


def _backend(cfg, rank: int, world: int, forward_only: bool = False):
    from dagrl.backends.megatron.train import MegatronTrainBackend
    from dagrl.config.role_specs import role_spec
    from dagrl.core.worker import ParallelContext

    spec = role_spec(cfg, "ref" if forward_only else "train")
    return train_backend(MegatronTrainBackend, cfg, ParallelContext(rank, world, torch.device("cpu")), spec)


def _logprobs_then_step(rank: int, world: int, cfg, batch):
    """Log-probs, one GRPO update on this rank's DP shard, then the full updated weights."""
    backend = _backend(cfg, rank, world)
    dp_rank, dp_size, returns = backend.dp_info()
    shard = batch.split(dp_size)[dp_rank]
    out, _ = backend.forward_logprobs(shard.select(INPUT_KEYS), "old_logprobs")
    _, metrics = backend.train_step(shard)
    weights = {k: v.clone() for bucket in backend.export_weights(to_cpu=True) for k, v in bucket.items()}
    return {
        "logprobs": out["old_logprobs"] if returns else None,
        "metrics": metrics if returns else None,
        "weights": weights,
        "returns": returns,
    }


INPUT_KEYS = ("prompts", "prompt_mask", "responses", "response_mask")


def _torch_reference(cfg, batch):
    """The torch backend (HF model): log-probs, then one update with them as old log-probs."""
    from dagrl.backends.torch.train import TorchTrainBackend
    from dagrl.core.batch import Batch
    from dagrl.core.worker import ParallelContext

    backend = train_backend(TorchTrainBackend, cfg, ParallelContext(0, 1, torch.device("cpu")))
    logprobs = backend.forward_logprobs(batch, "old_logprobs")[0]["old_logprobs"]
    # perturbed old log-probs: ratios away from 1, so clipping is exercised too
    old = logprobs + 0.1 * torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(1))
    batch = batch.union(Batch({"old_logprobs": old * batch["response_mask"]}))
    _, metrics = backend.train_step(batch)
    weights = {k: v.clone() for bucket in backend.export_weights(to_cpu=True) for k, v in bucket.items()}
    return batch, {"logprobs": logprobs, "metrics": metrics, "weights": weights}


@pytest.fixture(scope="module")
def reference():
    return _torch_reference(compose_config(*COMMON), make_batch())


def _assert_weights_close(got: dict, want: dict, atol: float = 1e-5) -> None:
    assert set(got) <= set(want) and {k for k in want if k != "lm_head.weight"} <= set(got)
    for name, tensor in got.items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=atol, msg=name)


def _check_against_reference(results: list[dict], reference) -> None:
    batch, ref = reference
    kept = [r for r in results if r["returns"]]
    assert kept, "no rank returned outputs"
    mask = batch["response_mask"]  # padding positions are never used; backends may differ there
    logprobs = torch.cat([r["logprobs"] for r in kept])
    torch.testing.assert_close(logprobs * mask, ref["logprobs"] * mask, rtol=0, atol=2e-5)
    # DP ranks report their shard's loss; with equal shards their mean is the whole batch's
    pg_loss = sum(r["metrics"]["actor/pg_loss"] for r in kept) / len(kept)
    assert pg_loss == pytest.approx(ref["metrics"]["actor/pg_loss"], rel=1e-4, abs=1e-6)
    assert kept[0]["metrics"]["actor/grad_norm"] == pytest.approx(ref["metrics"]["actor/grad_norm"], rel=1e-4)
    for r in results:
        _assert_weights_close(r["weights"], ref["weights"])


def test_tp1_matches_torch_backend(reference):
    batch, _ = reference
    results = run_distributed(_logprobs_then_step, 1, megatron_config(), batch)
    _check_against_reference(results, reference)


@pytest.mark.parametrize("sp", ["false", "true"], ids=["tp2", "tp2-sp"])
def test_tp2_matches_torch_backend(reference, sp):
    """With sequence parallel the sdpa spec's norms run on sequence shards (odd lengths padded)."""
    batch, _ = reference
    cfg = megatron_config(f"{M}.tensor_model_parallel_size=2", f"{M}.sequence_parallel={sp}")
    results = run_distributed(_logprobs_then_step, 2, cfg, batch)
    _check_against_reference(results, reference)


def test_pp2_matches_torch_backend(reference):
    batch, _ = reference
    cfg = megatron_config(f"{M}.pipeline_model_parallel_size=2")
    results = run_distributed(_logprobs_then_step, 2, cfg, batch)
    _check_against_reference(results, reference)


def test_dp2_distributed_optimizer_matches_torch_backend():
    # a sequence-mean loss: the mean of the two DP shards' losses is the whole batch's loss
    mode = "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"
    reference = _torch_reference(compose_config(*COMMON, mode), make_batch())
    cfg = megatron_config(mode, f"{M}.use_distributed_optimizer=true")
    results = run_distributed(_logprobs_then_step, 2, cfg, reference[0])
    assert [r["returns"] for r in results] == [True, True]
    _check_against_reference(results, reference)


def _offload_round_trip(rank: int, world: int, cfg, batch):
    backend = _backend(cfg, rank, world)
    backend.train_step(batch)  # grads and optimizer state exist from here on
    before, _ = backend.forward_logprobs(batch.select(INPUT_KEYS), "old_logprobs")
    backend.offload()
    left = sum(p.data.untyped_storage().nbytes() for p in backend._params())
    backend.onload()
    after, _ = backend.forward_logprobs(batch.select(INPUT_KEYS), "old_logprobs")
    backend.train_step(batch)  # the restored state trains
    return left, torch.equal(before["old_logprobs"], after["old_logprobs"])


@pytest.mark.parametrize("dist_opt", ["true", "false"])
def test_param_offload_frees_storage_and_restores_exactly(reference, dist_opt):
    """Under the distributed optimizer params are views of one buffer: the whole storage moves."""
    cfg = megatron_config(
        f"{M}.tensor_model_parallel_size=2",
        f"{M}.use_distributed_optimizer={dist_opt}",
        f"{M}.param_offload=true",
        f"{M}.grad_offload=true",
        f"{M}.optimizer_offload=true",
    )
    for left, same in run_distributed(_offload_round_trip, 2, cfg, reference[0]):
        assert left == 0 and same


# GiB on each rank's card, injected: there is no device memory to read on CPU
CARDS = [
    {"update/device_memory_used_gib": 57.71, "perf/device_memory_used_gib": 57.9, "perf/peak_added_gib": 6.0},
    {"update/device_memory_used_gib": 55.79, "perf/device_memory_used_gib": 58.4, "perf/peak_added_gib": 2.0},
]


def _gather_cards(rank: int, world: int, layout: dict):
    """megatron's groups at `layout` (init_parallel), then the update's card figures of the
    replica gathered: (whether the driver keeps this rank's metrics, the figures it reports)."""
    from dagrl.backends.megatron.parallel import dp_info, gather_fullest_cards, init_parallel
    from dagrl.config.actor_schema import MegatronConfig

    init_parallel(MegatronConfig(**layout), seed=0)
    return dp_info()[2], gather_fullest_cards(CARDS[rank], "update")


@pytest.mark.parametrize(
    "layout",
    [
        {"pipeline_model_parallel_size": 2},
        {"tensor_model_parallel_size": 2},
        {"context_parallel_size": 2},
    ],
    ids=["pp2", "tp2", "cp2"],
)
def test_the_kept_rank_reports_every_card_of_its_replica(layout):
    """The driver keeps TP rank 0 of the last stage (CP rank 0): it reports the fullest card of
    both ranks (rank 0's in use, rank 1's step peak), and under PP each stage's own."""
    results = run_distributed(_gather_cards, 2, layout)
    kept = [figures for returns, figures in results if returns]
    assert len(kept) == 1
    want = {
        "update/device_memory_used_gib": 57.71,
        "perf/device_memory_used_gib": 58.4,
        "perf/peak_added_gib": 6.0,
    }
    if "pipeline_model_parallel_size" in layout:
        want["update/stage0_device_memory_used_gib"] = 57.71
        want["update/stage1_device_memory_used_gib"] = 55.79
    assert kept[0] == want


def test_dp_replicas_keep_their_own_cards():
    """DP2: each replica is one card; the driver folds the replicas (core/metrics.py)."""
    results = run_distributed(_gather_cards, 2, {})
    assert [figures for _, figures in results] == CARDS


def _replica_figures(rank: int, world: int, layout: dict, phase: str, metrics: list[dict]):
    """megatron's groups at `layout`, then `phase`'s metrics of each rank as the backends hand them
    to the driver: (whether the driver keeps this rank's metrics, those metrics)."""
    from dagrl.backends.megatron.parallel import dp_info, init_parallel, replica_figures
    from dagrl.config.actor_schema import MegatronConfig

    init_parallel(MegatronConfig(**layout), seed=0)
    return dp_info()[2], replica_figures(metrics[rank], phase)


def _kept(results) -> dict:
    [kept] = [metrics for returns, metrics in results if returns]
    return kept


def test_a_critic_phase_reports_the_fullest_card_of_its_tp_ranks():
    """critic.megatron TP2 (its layout has no PP): the kept rank (TP 0) reports the fuller card's
    device in use and peak, and its own allocator counts (one card's calls, as the actor's)."""
    keys = ("device_memory_used_gib", "peak_added_gib", "device_mallocs")
    ranks = [
        {f"critic_update/{k}": v for k, v in zip(keys, card)}
        for card in ((30.5, 1.5, 12.0), (31.0, 1.0, 9.0))
    ]
    layout = {"tensor_model_parallel_size": 2}
    assert _kept(run_distributed(_replica_figures, 2, layout, "critic_update", ranks)) == {
        "critic_update/device_memory_used_gib": 31.0,
        "critic_update/peak_added_gib": 1.5,
        "critic_update/device_mallocs": 12.0,
    }


def test_what_the_offload_freed_is_the_fullest_cards_of_the_replica():
    """PP2: the stages hold different layers and vocabulary matrices, so their offloads free
    different amounts; the driver keeps the last stage's metrics, the plan counts the larger stage,
    and so does the figure. The allocator's counts stay the kept rank's."""
    ranks = [
        {**CARDS[0], "perf/offload_freed_gib": 4.5, "update/device_mallocs": 7.0},  # stage 0
        {**CARDS[1], "perf/offload_freed_gib": 4.0, "update/device_mallocs": 5.0},  # stage 1: kept
    ]
    kept = _kept(run_distributed(_replica_figures, 2, {"pipeline_model_parallel_size": 2}, "update", ranks))
    assert kept["perf/offload_freed_gib"] == 4.5 and kept["update/device_mallocs"] == 5.0
    assert kept["update/stage0_device_memory_used_gib"] == 57.71
