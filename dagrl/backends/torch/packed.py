"""The torch backend's forward over packed sequences (actor_rollout_ref.model.use_remove_padding).

transformers (4.53+, 5.x) reads packed sequences from the position ids: given no attention
mask, position ids that restart at 0 mark where a new sequence begins, and the mask it builds
for the model's attention implementation keeps attention inside each sequence (sdpa and eager: a
block-diagonal causal mask; flash-attention: variable-length kernels over the sequences; flex:
a block mask). So the packed rows of `dagrl.core.packing` go in as they are, with no 4D mask of
ours that would have to match each implementation's mask format. With sdpa (the default) the
mask is exact on CPU; on GPU a masked sdpa runs the memory-efficient kernel over each packed row.

The output layer runs only on the positions that predict response tokens (`logits_to_keep`
with their columns), and the log-probs land back on the ``[B, R]`` grid.
"""

from __future__ import annotations

import torch

from dagrl.algos import entropy_from_logits, logprobs_from_logits
from dagrl.backends.torch.distill import grid_logprobs_at
from dagrl.core.batch import Batch
from dagrl.core.packing import PackedSequences, pack_sequences
from dagrl.objectives import TokenOutputs, TokenRequest


def packed_token_outputs(
    module: torch.nn.Module, mb: Batch, request: TokenRequest, temperature: float, device: torch.device
) -> tuple[TokenOutputs, PackedSequences]:
    """What `request` asks for on the ``[B, R]`` response grid, from one forward over packed rows."""
    packed = pack_sequences(mb["prompts"], mb["prompt_mask"], mb["responses"], mb["response_mask"])
    # the logits of the columns that predict some response token; rows share the column list
    keep, keep_index = torch.unique(packed.token_columns, return_inverse=True)
    logits = module(
        input_ids=packed.input_ids.to(device),
        position_ids=packed.position_ids.to(device),
        attention_mask=None,  # the restarting position ids say where sequences begin
        use_cache=False,
        logits_to_keep=keep.to(device),
    ).logits  # [n, K, V]
    rows = packed.token_rows.to(device)
    columns = keep_index.to(device)
    targets = packed.token_targets.to(device)
    if device.type == "cuda":
        logprobs, entropy = _fused(logits, rows, columns, targets, temperature, request.entropy)
    else:
        raw = logits[rows, columns]  # [N, V]
        scaled = raw.float()[None] / temperature  # [1, N, V]: the [B, T, V] the algos expect
        logprobs = logprobs_from_logits(scaled, targets[None])[0]
        entropy = None
        if request.entropy:  # without entropy_grad a metric only: then no graph is kept for it
            with torch.set_grad_enabled(torch.is_grad_enabled() and request.entropy_grad):
                entropy = entropy_from_logits(scaled)[0]
    out = TokenOutputs(logprobs=packed.to_grid(logprobs) if request.logprobs else None)
    if entropy is not None:
        out.entropy = packed.to_grid(entropy if request.entropy_grad else entropy.detach())
    if request.logprobs_at is not None:
        ids = mb[request.logprobs_at].to(device)  # [B, R, K]
        token_ids = ids.flatten(0, 1)[packed.token_index.to(device)]  # [N, K]
        raw = logits[rows, columns]
        at = grid_logprobs_at(raw[None], token_ids[None], request.logprobs_at_temperature)[0]
        out.logprobs_at = packed.to_grid(at)
    return out, packed


def _fused(logits, rows, columns, targets, temperature: float, entropy: bool):
    """GPU: the Triton pass over the bf16 logits (no fp32 [N, V] copy), as the padded path uses."""
    from dagrl.backends.megatron.logprobs import response_logprobs  # torch + triton, no megatron

    # response_logprobs reads logits[positions[i], rows[i]] of an [S, B, V] tensor: S = packed rows
    res = response_logprobs(logits, columns, rows, targets, temperature, logits.shape[-1], entropy)
    return res if entropy else (res, None)
