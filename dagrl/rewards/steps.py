"""Where the steps of a response end, for a process reward model (pure functions)."""

from __future__ import annotations

import torch


def step_end_tokens(pieces: list[str], separator: str) -> list[int]:
    """Token indices that end a step: the token completing each `separator` occurrence in the
    text the pieces (each token's decoded text) spell, and the last token. Empty for no tokens.

    >>> step_end_tokens(["a", "\\n", "\\nb", "c"], "\\n\\n")
    [2, 3]
    """
    if not pieces:
        return []
    ends, total = [], 0
    for piece in pieces:
        total += len(piece)
        ends.append(total)  # character offset just after each token
    text, out, start = "".join(pieces), [], 0
    while separator and (found := text.find(separator, start)) >= 0:
        start = found + len(separator)
        token = next(i for i, end in enumerate(ends) if end >= start)
        if not out or out[-1] != token:
            out.append(token)
    if not out or out[-1] != len(pieces) - 1:
        out.append(len(pieces) - 1)  # the response's end closes its last step
    return out


def step_ends(
    tokenizer, responses: torch.Tensor, response_mask: torch.Tensor, separator: str
) -> torch.Tensor:
    """[B, S] long: the response index of each step's last token, -1 past a row's last step."""
    rows = []
    for ids, mask in zip(responses, response_mask):
        real = ids[mask.bool()].tolist()
        rows.append(step_end_tokens([tokenizer.decode([t]) for t in real], separator))
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out
