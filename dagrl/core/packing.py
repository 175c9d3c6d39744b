"""Sequence packing: a micro-batch's prompt+response tokens without the padding between them.

The batch layout (core/batch.py) is ``[B, P + R]``: left-padded prompts, right-padded responses,
so each row pays for the longest prompt and the longest response of the batch. Packing lays every
row's real tokens (prompt, then response) out as one *segment* and places the segments into rows
of bounded length (first-fit decreasing, capacity = the longest segment), so the model runs over
about as many tokens as there are real ones. Within a packed row:

- position ids restart at 0 at every segment (what the padded layout gives each sequence);
- attention stays inside a segment: block-diagonal causal;
- the tail after a row's last segment is padding, laid out as a segment of its own (positions
  0, 1, ...), so it never attends to nor is attended by real tokens.

The response tokens' coordinates in the packed rows map their log-probs back to the ``[B, R]``
grid (``to_grid``); response padding there gets 0.

Packing is exact: every sequence sees the same tokens at the same positions as in the padded
layout, so log-probs, entropies and gradients agree to floating-point rounding. The same idea as
verl's ``use_remove_padding`` and transformers' ``DataCollatorWithFlattening``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedSequences:
    """A micro-batch of B sequences packed into ``n`` rows of length ``L``.

    input_ids, position_ids, segment_ids: ``[n, L]`` long. segment_ids number the segments of a
        row 0, 1, ... (the tail padding, if any, is the last).
    token_rows, token_columns: ``[N]`` long: response token i is predicted by the logits at
        ``(token_rows[i], token_columns[i])`` of the packed rows (one position before it).
    token_targets: ``[N]`` long: the response token ids.
    token_index: ``[N]`` long: where each token lies in the flattened ``[B, R]`` response grid.
    response_shape: ``(B, R)``.
    real_tokens: prompt + response tokens of the B sequences.
    padded_tokens: ``B * (P + R)``, the padded layout's size.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor
    token_rows: torch.Tensor
    token_columns: torch.Tensor
    token_targets: torch.Tensor
    token_index: torch.Tensor
    response_shape: tuple[int, int]
    real_tokens: int
    padded_tokens: int

    @property
    def packed_tokens(self) -> int:
        """Tokens the model runs over: ``n * L`` (row tails included)."""
        return self.input_ids.numel()

    def attention_mask(self) -> torch.Tensor:
        """``[n, 1, L, L]`` bool, True = masked out (megatron's convention): block-diagonal causal."""
        seg = self.segment_ids
        width = seg.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=seg.device).tril()
        allowed = (seg[:, :, None] == seg[:, None, :]) & causal
        return ~allowed[:, None]

    def to_grid(self, values: torch.Tensor) -> torch.Tensor:
        """``[N, ...]`` per response token -> ``[B, R, ...]`` with 0 on response padding."""
        rows, resp_len = self.response_shape
        index = self.token_index.to(values.device)
        grid = values.new_zeros((rows * resp_len, *values.shape[1:])).index_copy(0, index, values)
        return grid.view(rows, resp_len, *values.shape[1:])


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins (lists of item indices) of total length <= capacity, longest items placed first.

    Every item must fit on its own (length <= capacity). First-fit decreasing uses at most
    11/9 OPT + 1 bins (Johnson 1973), a few percent over the optimum on real length mixes.
    """
    assert all(n <= capacity for n in lengths), f"an item longer than the capacity {capacity}"
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, room in enumerate(free):
            if lengths[i] <= room:
                bins[b].append(i)
                free[b] -= lengths[i]
                break
        else:
            bins.append([i])
            free.append(capacity - lengths[i])
    return bins


def pack_sequences(
    prompts: torch.Tensor,
    prompt_mask: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    multiple: int = 1,
) -> PackedSequences:
    """Pack a micro-batch's sequences into rows (see the module docstring). CPU tensors in and out.

    Args:
        prompts, prompt_mask: ``[B, P]`` left-padded prompt ids and their mask (>= 1 token per row).
        responses, response_mask: ``[B, R]`` right-padded response ids and their mask.
        multiple: the row length is rounded up to a multiple of this (sequence parallel splits
            rows over TP ranks).
    """
    rows, width = prompts.shape
    resp_len = responses.shape[1]
    prompt_lens = prompt_mask.sum(dim=1)
    response_lens = response_mask.sum(dim=1)
    assert (prompt_lens >= 1).all(), "every sequence needs a prompt token to predict its response from"
    assert bool((prompt_mask.flip(1).cummin(1).values == prompt_mask.flip(1)).all()), "prompts left-padded"
    assert bool((response_mask.cummin(1).values == response_mask).all()), "responses right-padded"
    lengths = (prompt_lens + response_lens).tolist()
    capacity = -(-max(lengths) // multiple) * multiple
    bins = first_fit_decreasing(lengths, capacity)
    input_ids = torch.zeros(len(bins), capacity, dtype=torch.long)
    position_ids = torch.zeros_like(input_ids)
    segment_ids = torch.zeros_like(input_ids)
    starts = torch.zeros(rows, dtype=torch.long)  # each sequence's first column in its packed row
    packed_row = torch.zeros(rows, dtype=torch.long)
    for r, members in enumerate(bins):
        at = 0
        for s, b in enumerate(members):
            p, n = int(prompt_lens[b]), int(response_lens[b])
            input_ids[r, at : at + p] = prompts[b, width - p :]
            input_ids[r, at + p : at + p + n] = responses[b, :n]
            position_ids[r, at : at + p + n] = torch.arange(p + n)
            segment_ids[r, at : at + p + n] = s
            starts[b], packed_row[b] = at, r
            at += p + n
        position_ids[r, at:] = torch.arange(capacity - at)  # the tail: a segment of its own
        segment_ids[r, at:] = len(members)
    # response token j of sequence b is predicted by the logits one position before it
    real = response_mask.bool().flatten()
    columns = (starts + prompt_lens - 1)[:, None] + torch.arange(resp_len)[None]
    return PackedSequences(
        input_ids=input_ids,
        position_ids=position_ids,
        segment_ids=segment_ids,
        token_rows=packed_row.repeat_interleave(resp_len)[real],
        token_columns=columns.flatten()[real],
        token_targets=responses.flatten()[real],
        token_index=real.nonzero().squeeze(1),
        response_shape=(rows, resp_len),
        real_tokens=int(sum(lengths)),
        padded_tokens=rows * (width + resp_len),
    )


@dataclass
class PaddingStats:
    """Token counts over a pass, for the metrics that show what packing saves.

    pad_fraction: share of the padded ``[B, P + R]`` layout that is padding (what packing removes;
        reported with packing off too, as what it would save).
    packed_pad_fraction: share of the packed rows that is still padding (row tails).
    """

    real: int = 0
    padded: int = 0
    packed: int = 0

    def add(self, real: int, padded: int, packed: int = 0) -> None:
        self.real += real
        self.padded += padded
        self.packed += packed

    def metrics(self) -> dict[str, float]:
        if not self.padded:
            return {}
        out = {"perf/pad_fraction": 1.0 - self.real / self.padded}
        if self.packed:
            out["perf/packed_pad_fraction"] = 1.0 - self.real / self.packed
        return out


def sequence_lengths(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> int:
    """Real tokens of a padded micro-batch (prompt + response)."""
    return int(prompt_mask.sum() + response_mask.sum())
