"""The torch backend's forward over packed sequences (actor_rollout_ref.model.use_remove_padding).

transformers (4.53+, 5.x) reads packed sequences from the position ids: given no attention
mask, position ids that restart at 0 mark where a new sequence begins, and the mask it builds
for the model's attention implementation keeps attention inside each sequence (sdpa and eager: a
block-diagonal causal mask; flash-attention: variable-length kernels over the sequences; flex:
a block mask). So the packed rows of `dagrl.core.packing` go in as they are, with no 4D mask of
ours that would have to match each implementation's mask format. With sdpa (the default) the
mask is exact on CPU; on GPU a masked sdpa runs the memory-efficient kernel over each packed row.

The output layer runs only on the N positions that predict response tokens (`_head_on`), and
the log-probs land back on the ``[B, R]`` grid.
"""

from __future__ import annotations

import contextlib

import torch

from dagrl.algos import entropy_from_logits, logprobs_from_logits
from dagrl.backends.torch.distill import grid_logprobs_at
from dagrl.core.batch import Batch, response_attention
from dagrl.core.packing import PackedSequences, pack_sequences
from dagrl.objectives import TokenOutputs, TokenRequest


def packed_token_outputs(
    module: torch.nn.Module, mb: Batch, request: TokenRequest, temperature: float, device: torch.device
) -> tuple[TokenOutputs, PackedSequences]:
    """What `request` asks for on the ``[B, R]`` response grid, from one forward over packed rows."""
    packed = pack_sequences(mb["prompts"], mb["prompt_mask"], mb["responses"], response_attention(mb))
    width = packed.input_ids.shape[1]
    flat = (packed.token_rows * width + packed.token_columns).to(device)  # [N] into the [n * L] tokens
    with _head_on(module, flat):
        logits = module(
            input_ids=packed.input_ids.to(device),
            position_ids=packed.position_ids.to(device),
            attention_mask=None,  # the restarting position ids say where sequences begin
            use_cache=False,
        ).logits[0]  # [N, V]
    targets = packed.token_targets.to(device)
    if device.type == "cuda":
        logprobs, entropy = _fused(logits, targets, temperature, request.entropy)
    else:
        scaled = logits.float()[None] / temperature  # [1, N, V]: the [B, T, V] the algos expect
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
        at = grid_logprobs_at(logits[None], token_ids[None], request.logprobs_at_temperature)[0]
        out.logprobs_at = packed.to_grid(at)
    return out, packed


@contextlib.contextmanager
def _head_on(module: torch.nn.Module, flat_index: torch.Tensor):
    """The output layer applied to the N response-predicting positions only, as ``[1, N, H]``.

    Prompt positions and row tails need no logits; HF's `logits_to_keep` can only pick the same
    columns in every row, which in packed rows is nearly all of them. A pre-hook on the output
    layer gathers the positions from its ``[n, L, H]`` input inside the model's forward (so DDP,
    gradient checkpointing and post-head transforms such as soft-capping see a normal call);
    the model then returns logits ``[1, N, V]``.
    """
    head = getattr(module, "module", module).get_output_embeddings()  # through DDP

    def gather(_, args):
        return (args[0].flatten(0, 1)[flat_index][None], *args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        yield
    finally:
        handle.remove()


def _fused(logits, targets, temperature: float, entropy: bool):
    """GPU: the Triton pass over the bf16 logits (no fp32 [N, V] copy), as the padded path uses."""
    from dagrl.backends.logprob_kernel import response_logprobs

    # response_logprobs reads logits[positions[i], rows[i]] of an [S, B, V] tensor: here [N, 1, V]
    positions = torch.arange(len(targets), device=targets.device)
    res = response_logprobs(
        logits[:, None],
        torch.zeros_like(positions),
        positions,
        targets,
        temperature,
        logits.shape[-1],
        entropy,
    )
    return res if entropy else (res, None)
