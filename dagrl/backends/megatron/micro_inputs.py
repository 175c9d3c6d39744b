"""One micro-batch as megatron's model takes it (`MicroInputs`): the rows left-aligned in one
tensor, or packed into rows of several sequences (actor_rollout_ref.actor.use_remove_padding),
with the response tokens each position predicts and what the loss reads, on the device before
megatron's schedule runs; and the padding they cost (perf/padding_*)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dagrl.core.batch import Batch, response_attention, sequence_inputs
from dagrl.core.packing import PaddingStats, pack_sequences


@dataclass
class MicroInputs:
    """One micro-batch as megatron's model takes it, plus what the loss needs."""

    batch: Batch  # on device: the objective's required keys
    input_ids: torch.Tensor  # [B, S] on device: each row's prompt + response from column 0
    position_ids: torch.Tensor  # [B, S]: 0 .. S-1
    # the response tokens whose predicting position lies inside the S columns, flattened:
    token_index: torch.Tensor  # [N] index into the [B, R] response grid
    token_rows: torch.Tensor  # [N] row b
    token_positions: torch.Tensor  # [N] the position whose logits predict the token
    token_targets: torch.Tensor  # [N] the token id
    response_shape: tuple[int, int]  # (B, R)
    weight: float  # share of the mini-batch loss this micro-batch carries
    real_tokens: int  # prompt + response tokens of the B rows
    padded_tokens: int  # B x S: what the unpacked layout runs
    # packed rows (use_remove_padding): [n, 1, S, S] bool block-diagonal causal, True = masked
    # out; the position ids restart at every sequence and drive the rotary embedding
    attention_mask: torch.Tensor | None = None


def micro_inputs(
    mb: Batch, weight: float, loss_keys: tuple[str, ...], dev: torch.device, multiple: int, packing: bool
) -> MicroInputs:
    """Left-align every row: its real prompt tokens from column 0, the response right after,
    all padding at the end. Padding then only ever follows real tokens, so plain causal
    attention is exact with no padding mask (SDPA / TE take their causal fast path), position
    ids are aranges as HF counts them, and columns past the longest row are dropped.

    Everything the schedule and the loss read goes to the device here, before the schedule
    runs: a copy from pageable memory inside it would wait for the GPU to drain."""
    if packing:
        return packed_micro_inputs(mb, weight, loss_keys, dev, multiple)
    ids, _, _ = sequence_inputs(mb["prompts"], mb["prompt_mask"], mb["responses"], response_attention(mb))
    width = ids.shape[1]
    prompt_lens = mb["prompt_mask"].sum(dim=1)
    left_pad = mb["prompts"].shape[1] - prompt_lens
    ids = ids.gather(1, (torch.arange(width)[None] + left_pad[:, None]) % width)
    seq = int((prompt_lens + response_attention(mb).sum(dim=1)).max().clamp(min=1))
    seq = -(-seq // multiple) * multiple  # sequence parallel splits the sequence over TP ranks
    ids = torch.nn.functional.pad(ids, (0, max(0, seq - width)))[:, :seq]
    pos = torch.arange(seq).expand_as(ids)
    # logits at position t predict token t+1: row b's response token j comes from p_b - 1 + j;
    # positions past the S columns only exist for response padding (masked in the loss)
    rows, resp_len = mb["responses"].shape
    at = prompt_lens[:, None] - 1 + torch.arange(resp_len)[None]
    inside = (at < seq).flatten()
    return MicroInputs(
        batch=Batch({k: mb[k].to(dev) for k in loss_keys if k in mb}),
        input_ids=ids.to(dev),
        position_ids=pos.to(dev),
        token_index=inside.nonzero().squeeze(1).to(dev),
        token_rows=torch.arange(rows).repeat_interleave(resp_len)[inside].to(dev),
        token_positions=at.flatten()[inside].to(dev),
        token_targets=mb["responses"].flatten()[inside].to(dev),
        response_shape=(rows, resp_len),
        weight=weight,
        real_tokens=int(prompt_lens.sum() + response_attention(mb).sum()),
        padded_tokens=ids.numel(),
    )


def packed_micro_inputs(
    mb: Batch, weight: float, loss_keys: tuple[str, ...], dev: torch.device, multiple: int
) -> MicroInputs:
    """The rows' sequences packed into rows as long as the longest (core/packing.py): the
    transformer and the output layer run over about the real tokens only; attention is kept
    inside each sequence by an explicit block-diagonal causal mask (sdpa and local specs)."""
    packed = pack_sequences(
        mb["prompts"], mb["prompt_mask"], mb["responses"], response_attention(mb), multiple
    )
    return MicroInputs(
        batch=Batch({k: mb[k].to(dev) for k in loss_keys if k in mb}),
        input_ids=packed.input_ids.to(dev),
        position_ids=packed.position_ids.to(dev),
        token_index=packed.token_index.to(dev),
        token_rows=packed.token_rows.to(dev),
        token_positions=packed.token_columns.to(dev),
        token_targets=packed.token_targets.to(dev),
        response_shape=packed.response_shape,
        weight=weight,
        real_tokens=packed.real_tokens,
        # the unpacked layout: every row as long as the longest sequence (the packed row length)
        padded_tokens=len(mb) * packed.input_ids.shape[1],
        attention_mask=packed.attention_mask().to(dev),
    )


def padding_stats(micros: list[MicroInputs]) -> PaddingStats:
    stats = PaddingStats()
    for mi in micros:
        packed = mi.input_ids.numel() if mi.attention_mask is not None else 0
        stats.add(mi.real_tokens, mi.padded_tokens, packed)
    return stats
