"""Between dagrl's padded tensors and vLLM's per-request token lists. Pure: no vLLM import.

vLLM takes each prompt as a list of token ids (no padding) and returns, per request, the sampled
token ids and (with `logprobs=0`, `flat_logprobs=True`) one log-prob per sampled token. The batch
wants fixed-width right-padded [B, R] tensors so DP shards concatenate.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def prompt_token_lists(prompts: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """[B, P] left-padded ids and mask -> B lists of the real prompt ids."""
    return [row[mask.bool()].tolist() for row, mask in zip(prompts, prompt_mask)]


def responses_to_tensors(
    token_ids: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]] | None,
    width: int,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-request sampled ids (and their log-probs) -> responses, response_mask, rollout_logprobs,
    each [B, width], right-padded (pad_id / 0 / 0.0).

    A request that stopped at EOS keeps the EOS token (mask 1), as the hf rollout does. Without
    log-probs (rollout.calculate_log_probs=false) rollout_logprobs is all zeros.
    """
    rows = len(token_ids)
    responses = torch.full((rows, width), pad_id, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    out_logprobs = torch.zeros((rows, width), dtype=torch.float32)
    for i, ids in enumerate(token_ids):
        n = len(ids)
        assert n <= width, f"request {i} returned {n} tokens, more than max_tokens={width}"
        if n == 0:
            continue
        responses[i, :n] = torch.as_tensor(ids, dtype=torch.long)
        mask[i, :n] = 1
        if logprobs is not None:
            lp = logprobs[i]
            assert len(lp) == n, f"request {i}: {len(lp)} log-probs for {n} tokens"
            out_logprobs[i, :n] = torch.as_tensor(lp, dtype=torch.float32)
    return responses, mask, out_logprobs
