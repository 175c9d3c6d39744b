"""Between dagrl's padded tensors and vLLM's per-request token lists. Pure: no vLLM import.

vLLM takes each prompt as a list of token ids (no padding) and returns, per request, the sampled
token ids and (with `logprobs=0`, `flat_logprobs=True`) one log-prob per sampled token. The batch
wants fixed-width right-padded [B, R] tensors so DP shards concatenate. A standalone teacher
scores prompt + response with `prompt_logprobs=k`; its per-position top-k become [B, R, K] tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def prompt_token_lists(prompts: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """[B, P] left-padded ids and mask -> B lists of the real prompt ids."""
    return [row[mask.bool()].tolist() for row, mask in zip(prompts, prompt_mask)]


def completions_in_row_order(outputs: Sequence, n: int, prompts: Sequence[Sequence[int]]) -> list:
    """One completion per row from one request output per prompt (`RequestOutput`s in request
    order, as `LLM.generate` returns them), each with `n` completions: request r's completion i
    is row r * n + i, the order of collate's rows (a prompt's n samples are consecutive rows).

    The completions are placed by their own `index` (vLLM's sample number within the request,
    0..n-1), not by their place in the list; each output's prompt must be request r's prompt
    (`prompts[r]`), so a reordering fails here instead of pairing a response with another prompt.
    """
    assert len(outputs) == len(prompts), f"{len(outputs)} request outputs for {len(prompts)} prompts"
    rows = []
    for r, (output, prompt) in enumerate(zip(outputs, prompts)):
        assert list(output.prompt_token_ids) == list(prompt), f"request {r}: the output of another prompt"
        by_index = sorted(output.outputs, key=lambda c: c.index)
        assert [c.index for c in by_index] == list(range(n)), (
            f"request {r}: samples {[c.index for c in by_index]}, expected 0..{n - 1}"
        )
        rows.extend(by_index)
    return rows


def responses_to_tensors(
    token_ids: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]] | None,
    width: int,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-request sampled ids (and their log-probs) -> responses, response_mask, rollout_logprobs,
    each [B, width], right-padded (pad_id / 0 / 0.0).

    A request that stopped at EOS keeps the EOS token (mask 1), as the hf rollout does. Without
    log-probs (rollout.calculate_log_probs off: false, or auto where nothing reads them)
    rollout_logprobs is all zeros.
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


def teacher_request_ids(
    prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor, response_mask: torch.Tensor
) -> tuple[list[list[int]], list[int]]:
    """What a standalone teacher scores: per row its prompt's real ids followed by the response's
    real ids (the student's token ids, never re-tokenised text), and the prompt's length.

    ``prompts`` is the student's prompt for GKD, or the teacher's own (``teacher_prompts``) for OPSD;
    the response then starts at that prompt's length.
    """
    requests, prompt_lens = [], []
    for prompt, pmask, response, rmask in zip(prompts, prompt_mask, responses, response_mask):
        ids = prompt[pmask.bool()].tolist()
        prompt_lens.append(len(ids))
        requests.append(ids + response[rmask.bool()].tolist())
    return requests, prompt_lens


def prompt_logprobs_to_topk(
    prompt_logprobs: Sequence,
    prompt_lens: Sequence[int],
    response_lens: Sequence[int],
    k: int,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """vLLM prompt log-probs of prompt + response -> the teacher's top-k on the response grid.

    Per request, vLLM returns one entry per prompt token (``SamplingParams(prompt_logprobs=k)``):
    entry ``i`` describes the distribution that predicts token ``i`` from tokens ``< i`` (entry 0 is
    None: nothing predicts the first token). An entry holds the *actual* token ``i`` first, with
    its true rank, then the top-k with ranks 1..k. As a dict ``{token_id: Logprob}`` the actual
    token is not repeated when it is in the top-k (k entries, else k + 1); as ``FlatLogprobs`` every
    position holds k + 1 entries. Response token ``r`` of a row whose (teacher) prompt has ``P``
    tokens is predicted by entry ``P + r``.

    Args:
        prompt_logprobs: per request, a list of ``dict[int, Logprob] | None`` or a ``FlatLogprobs``
            (``start_indices``, ``end_indices``, ``token_ids``, ``logprobs``, ``ranks``).
        prompt_lens: per request, the length of the prompt in front of the response.
        response_lens: per request, the real response tokens scored.
        k: top-k asked for. width: R, the batch's response width.

    Returns:
        ids ``[B, R, K]`` long and log-probs ``[B, R, K]`` fp32, best first; and the number of
        response positions vLLM returned nothing for. Cells with nothing (response padding, missing
        entries) hold ids 0..K-1 at log(1/(K+1)) each: a proper sub-distribution, so the
        divergence there is finite before the response mask zeroes it.
    """
    rows = len(prompt_logprobs)
    ids = torch.arange(k, dtype=torch.long).expand(rows, width, k).clone()
    logprobs = torch.full((rows, width, k), -math.log(k + 1), dtype=torch.float32)
    missing = 0
    for b, (entries, start, n) in enumerate(zip(prompt_logprobs, prompt_lens, response_lens)):
        assert n <= width, f"request {b}: {n} response tokens, more than the width {width}"
        if n == 0:
            continue
        if hasattr(entries, "start_indices"):
            missing += _flat_into(entries, start, n, k, ids[b], logprobs[b])
        else:
            missing += _dicts_into(entries, start, n, k, ids[b], logprobs[b])
    return ids, logprobs, missing


def _flat_into(flat, start: int, n: int, k: int, ids: torch.Tensor, logprobs: torch.Tensor) -> int:
    """FlatLogprobs: every position of a request holds the actual token, then the top-k in rank
    order, so the response positions form one [n, k + 1] block of the flat lists."""
    if len(flat.start_indices) < start + n:
        return _dicts_into(flat, start, n, k, ids, logprobs)
    first, last = flat.start_indices[start], flat.end_indices[start + n - 1]
    if last - first != n * (k + 1):  # not the uniform layout: read position by position
        return _dicts_into(flat, start, n, k, ids, logprobs)
    block = slice(first, last)
    ids[:n] = torch.as_tensor(flat.token_ids[block], dtype=torch.long).view(n, k + 1)[:, 1:]
    logprobs[:n] = torch.as_tensor(flat.logprobs[block], dtype=torch.float32).view(n, k + 1)[:, 1:]
    return 0


def _dicts_into(entries, start: int, n: int, k: int, ids: torch.Tensor, logprobs: torch.Tensor) -> int:
    missing = 0
    for r in range(n):
        pos = start + r
        entry = entries[pos] if pos < len(entries) else None
        if not entry:
            missing += 1
            continue
        items = list(entry.items())
        # the actual token comes first; k + 1 entries means it is not among the top-k
        assert len(items) in (k, k + 1), f"position {pos}: {len(items)} entries for top-{k}"
        top = sorted(items[1:] if len(items) == k + 1 else items, key=lambda item: item[1].rank)
        assert top[-1][1].rank <= k, f"position {pos}: ranks {[lp.rank for _, lp in top]} are not a top-{k}"
        ids[r] = torch.as_tensor([token for token, _ in top], dtype=torch.long)
        logprobs[r] = torch.as_tensor([lp.logprob for _, lp in top], dtype=torch.float32)
    return missing
