"""The megatron backend's memory estimate under pipeline parallelism (dagrl/backends/megatron/memory.py),
against figures worked out by hand. Session 24's 2g-0.6b-megatron-pp2 row read 20.81 / 55.79 GiB where
the plan, spreading the model and the update evenly over the stages, said 17.23 / 70.31."""

from __future__ import annotations

from dagrl.backends.megatron.memory import (
    MegatronLayout,
    largest,
    layer_activation_bytes,
    state_bytes,
    update_stages,
)
from dagrl.backends.memory import Workload
from dagrl.backends.model_shape import ModelShape

# Qwen3-0.6B: 28 layers of 1024, a tied 151,936-word embedding (155.6M of its 596.0M parameters)
VOCAB = 151_936 * 1024
QWEN3_06B = ModelShape(
    hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=3072, vocab=151_936,
    tied=True, params=596_049_920, qk_norm=True,
)  # fmt: skip
UNTIED = ModelShape(**{**QWEN3_06B.__dict__, "tied": False, "params": 596_049_920 + VOCAB})


def largest_update(*args, **kwargs) -> dict[str, float]:
    return largest(update_stages(*args, **kwargs))


def weights(shape: ModelShape, layout: MegatronLayout) -> float:
    parts, _ = state_bytes(shape, layout, "bfloat16", trains=True, distributed_optimizer=True)
    return parts["weights"]


def test_each_end_stage_holds_a_vocabulary_matrix():
    """Layers split evenly over the stages; the first adds the embedding, the last the output layer,
    for a tied model a copy of the embedding: 0.376B parameters a stage of 0.6B, not 0.298B."""
    layers = 596_049_920 - VOCAB
    assert weights(QWEN3_06B, MegatronLayout(pp=2, workers=2)) == 2 * (layers / 2 + VOCAB)
    assert weights(QWEN3_06B, MegatronLayout(pp=1)) == 2 * 596_049_920  # the tied matrix once
    # untied: a matrix at each end, so PP=2 halves the model and PP=4 does not quarter it
    assert weights(UNTIED, MegatronLayout(pp=2, workers=2)) == 2 * (UNTIED.params / 2)
    assert weights(UNTIED, MegatronLayout(pp=4, workers=4)) == 2 * (layers / 4 + VOCAB)
    # tensor parallel splits the stage, the vocabulary matrix included (vocab-parallel)
    assert weights(QWEN3_06B, MegatronLayout(tp=2, pp=2, workers=4)) == 2 * (layers / 2 + VOCAB) / 2
    # the gradient buffers and Adam's state follow the stage's parameters
    parts, _ = state_bytes(QWEN3_06B, MegatronLayout(pp=2, workers=2), "bfloat16", True, True)
    assert parts["grads"] == 4 * (layers / 2 + VOCAB) and parts["optimizer"] == 12 * (layers / 2 + VOCAB)


def test_the_larger_stage_is_planned_first_with_its_micro_batches_in_flight_or_last_with_the_logits():
    """1F1B: the first stage keeps min(PP, micro-batches) micro-batches of its layers and makes no
    logits; the last keeps one and makes the logits and their gradient. The row's update: 128 rows
    of 384 tokens in 2 micro-batches; the first stage's two micro-batches of 14 layers (38.06 GiB)
    outweigh the last stage's one and its logits (19.03 + 13.91)."""
    work = Workload(rows=64, seq=384, response=256, micro_batches=2)
    tokens = 64 * 384
    layer = layer_activation_bytes(QWEN3_06B, 2, MegatronLayout(pp=2)) * tokens
    logits = 2 * 2 * tokens * 151_936
    assert largest_update(QWEN3_06B, 2, MegatronLayout(pp=2, workers=2), work) == {
        "activations": 2 * 14 * layer
    }
    assert largest_update(QWEN3_06B, 2, MegatronLayout(pp=1), work) == {
        "activations": 28 * layer,
        "logits": logits,
    }
    # one micro-batch: nothing else in flight on the first stage, the last stage is the larger
    single = Workload(rows=64, seq=384, response=256, micro_batches=1)
    assert largest_update(QWEN3_06B, 2, MegatronLayout(pp=2, workers=2), single) == {
        "activations": 14 * layer,
        "logits": logits,
    }
    # four stages: the first keeps at most its micro-batch count in flight
    four = largest_update(
        QWEN3_06B, 2, MegatronLayout(pp=4, workers=4), Workload(64, 384, 256, micro_batches=8)
    )
    assert four == {"activations": 4 * 7 * layer}


def test_recomputed_stages_keep_inputs_and_one_layer():
    """Under full recompute a stage keeps each layer's input per micro-batch in flight; the first
    stage adds one recomputed layer, the last the larger of that layer and the logits (freed first)."""
    work = Workload(rows=64, seq=384, response=256, micro_batches=2)
    tokens = 64 * 384
    layer = layer_activation_bytes(QWEN3_06B, 2, MegatronLayout(pp=2)) * tokens
    kept = 2 * 1024 * tokens
    logits = 2 * 2 * tokens * 151_936
    first = {"activations": 2 * 14 * kept + layer}
    last = {"activations": 14 * kept, "logits": logits}  # the logits outweigh a layer
    planned = largest_update(QWEN3_06B, 2, MegatronLayout(pp=2, workers=2), work, recompute_layers=14)
    assert planned == max(first, last, key=lambda p: sum(p.values())) == last


def test_four_stages_warm_up_fewer_micro_batches_down_the_pipeline():
    """TP2 x PP4 (siiRL's 8-GPU layout): stage s keeps min(PP - s, micro-batches) micro-batches of
    its 7 layers, the last one micro-batch and the logits; the middle stages hold no vocabulary
    matrix."""
    from dagrl.backends.megatron.memory import stage_params, update_stages

    layout = MegatronLayout(tp=2, pp=4, workers=8)
    work = Workload(rows=16, seq=672, response=512, micro_batches=8)
    layer = layer_activation_bytes(QWEN3_06B, 2, layout) * 16 * 672
    logits = 2 * 2 * 16 * 672 * 151_936 / 2
    stages = update_stages(QWEN3_06B, 2, layout, work)
    assert stages == [
        {"activations": 4 * 7 * layer},
        {"activations": 3 * 7 * layer},
        {"activations": 2 * 7 * layer},
        {"activations": 7 * layer, "logits": logits},
    ]
    layers = 596_049_920 - VOCAB
    assert [stage_params(QWEN3_06B, layout, s)[0] for s in range(4)] == [
        (layers / 4 + VOCAB) / 2,
        layers / 4 / 2,
        layers / 4 / 2,
        (layers / 4 + VOCAB) / 2,
    ]
    assert stage_params(QWEN3_06B, layout) == stage_params(QWEN3_06B, layout, 0)  # the largest: an end
