"""Batch: named tensors and per-row metadata under declared keys, with DP split/concat.

Every key a node reads or writes is declared in KEYS (plugins add theirs through
`declare_key`), so a typo fails at DAG validation instead of deep inside a worker.
Tensors share dim 0 (rows). Layout of a sequence row (as in verl):
    prompts   [B, P]  left-padded
    responses [B, R]  right-padded, response_mask [B, R] marks real tokens
Multi-turn rows (dagrl/rollout) hold observations inside `responses`: there response_mask marks
only the policy's tokens and response_attention_mask every real one (`response_attention`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from itertools import accumulate

import torch

# key -> description. Tensor keys hold torch tensors [B, ...]; meta keys hold python lists of length B.
KEYS: dict[str, str] = {
    "prompts": "[B, P] left-padded prompt token ids",
    "prompt_mask": "[B, P] 1 on prompt tokens",
    "teacher_prompts": "[B, P'] left-padded privileged teacher prompt ids (OPSD)",
    "teacher_prompt_mask": "[B, P'] 1 on teacher prompt tokens",
    "responses": "[B, R] right-padded response token ids",
    "response_mask": "[B, R] 1 on response tokens the policy sampled (what losses and metrics count)",
    "response_attention_mask": "[B, R] multi-turn: 1 on every real response token, observations too",
    "turn_ids": "[B, R] multi-turn: assistant turn of each response token (its observation too); -1 pad",
    "turn_rewards": "[B, T] multi-turn: the environment's reward after each assistant turn",
    "env_rewards": "[B] multi-turn: the environment's rewards of an episode, summed",
    "rollout_logprobs": "[B, R] the sampled tokens' log-probs under the rollout policy (vLLM: 0 unless asked)",
    "old_logprobs": "[B, R] log-probs under the actor before this step's update",
    "ref_logprobs": "[B, R] log-probs under the reference model",
    "teacher_topk_ids": "[B, R, K] teacher's top-k token ids",
    "teacher_topk_logprobs": "[B, R, K] teacher's top-k log-probs",
    "teacher_logprobs": "[B, R] teacher log-probs of the sampled tokens",
    "dataset_responses": "[B, R] right-padded reference response ids from the data (data.response_key)",
    "dataset_response_mask": "[B, R] 1 on reference response tokens",
    "off_policy": "[B] 1.0 where the responses are the dataset's (an off-policy step), 0.0 where sampled",
    "teacher_hidden": "[B, R, H'] teacher final hidden states predicting each response token (full vocabulary)",
    "scores": "[B] sequence reward (weighted sum of reward functions)",
    "token_rewards": "[B, R] per-token reward (score on the last token, minus KL in reward)",
    "advantages": "[B, R] advantages",
    "row_advantages": "[B] advantages one value per row, sent so (core/row_values.py); the update expands them",
    "values": "[B, R] the critic's values at sampling time (PPO), at the positions predicting each token",
    "returns": "[B, R] the critic's regression targets (GAE: advantages before whitening + values)",
    "group_ids": "[B] long: rows with the same id answer the same prompt",
    # meta keys
    "data_source": "meta: dataset name of each row",
    "ground_truth": "meta: reference answer of each row",
    "extra_info": "meta: dict of extra per-row info",
}
META_KEYS = {"data_source", "ground_truth", "extra_info"}


def declare_key(name: str, description: str, meta: bool = False) -> None:
    """Declare a batch key for a plugin node kind."""
    KEYS.setdefault(name, description)
    if meta:
        META_KEYS.add(name)


@dataclass
class Held:
    """A column that stayed on the workers that computed it (dagrl/core/residency.py).

    On the driver `part` is None: the whole column, DP rank r's rows (contiguous, as `split` cuts
    them) on that rank's workers; `source` says where (driver only, not pickled). `split` over the
    same DP size gives the pieces (`part` = r) a call sends so that rank r reads its own store.
    `value` is the column itself when the driver has it too (a mirrored output, or once fetched);
    `materialize` returns it, fetching it from the workers if need be.

    A column handed over to other pools (residency: `Keep.hand`) is in Ray's object store too:
    `refs` lists (object ref, start, stop) per piece, in row order: rows start..stop of the tensor
    each producer put. Those pieces can be cut for a reader of any DP size (`pieces`): its worker
    gets its rows from the object store, the driver passes only the refs.
    """

    run: str
    key: str
    rows: int
    dp_size: int
    part: int | None = None
    nbytes: int = 0
    value: torch.Tensor | None = None
    source: object = field(default=None, repr=False, compare=False)  # residency.HeldSource
    refs: tuple = ()  # handed over: ((ObjectRef, start, stop), ...) covering the rows in order

    def __len__(self) -> int:
        return self.rows

    def __getstate__(self) -> dict:
        return {**self.__dict__, "source": None}  # the driver's view of the pools stays there

    def materialize(self) -> torch.Tensor:
        if self.value is None:
            assert self.source is not None, f"{self.key} is held on workers and cannot be fetched from here"
            with self.source.lock:
                if self.value is None:
                    self.value = self.source.fetch(self)
        return self.value

    def pieces(self, parts: int) -> list[Held]:
        """DP rank r's piece for each of `parts` ranks: of the producer's DP size when the pieces
        are read from the workers' stores, of any size when they are in the object store."""
        assert self.part is None, f"{self.key}: pieces of piece {self.part}"
        assert parts == self.dp_size or self.refs, f"{self.key}: {parts} parts of {self}"
        assert self.rows % parts == 0, f"{self.key}: {self.rows} rows do not split over {parts} DP ranks"
        size = self.rows // parts
        return [
            replace(
                self,
                rows=size,
                part=r,
                nbytes=self.nbytes // parts,
                value=None if self.value is None else self.value[r * size : (r + 1) * size],
                refs=_cut(self.refs, r * size, (r + 1) * size),
            )
            for r in range(parts)
        ]

    @staticmethod
    def join(pieces: list[Held]) -> Held:
        """The whole column from the pieces of DP ranks 0..n-1, in order."""
        first = pieces[0]
        assert [p.part for p in pieces] == list(range(first.dp_size)), f"{first.key}: pieces out of DP order"
        values = [p.value for p in pieces]
        value = torch.cat(values) if all(v is not None for v in values) else None
        rows, nbytes = sum(p.rows for p in pieces), sum(p.nbytes for p in pieces)
        refs = sum((p.refs for p in pieces), ()) if all(p.refs for p in pieces) else ()
        return replace(first, rows=rows, part=None, nbytes=nbytes, value=value, refs=refs)


def _cut(refs: tuple, start: int, stop: int) -> tuple:
    """The (ref, start, stop) slices of `refs` that hold rows start..stop of the column."""
    ends = list(accumulate(b - a for _, a, b in refs))
    out = []
    for (ref, a, b), end in zip(refs, ends):
        first = end - (b - a)  # the column's row at this slice's start
        lo, hi = max(start, first), min(stop, end)
        if lo < hi:
            out.append((ref, a + lo - first, a + hi - first))
    return tuple(out)


@dataclass
class Repeated:
    """A column on its way to the workers as its distinct rows: row i of `rows` stands for rows
    i*n .. i*n+n-1 (collate's n samples of one prompt). A tensor column, or a meta column's list
    (ground truth, extra_info: what an environment's reset reads). The worker expands it
    (`Batch.expanded`) before any backend reads the batch, so backends see the rows the driver had."""

    rows: torch.Tensor | list
    n: int

    def __len__(self) -> int:
        return len(self.rows) * self.n

    def expand(self) -> torch.Tensor | list:
        if isinstance(self.rows, list):
            return [row for row in self.rows for _ in range(self.n)]
        return self.rows.repeat_interleave(self.n, dim=0)


@dataclass
class Batch:
    """Named tensors (`tensors`, first dimension = rows) and per-row metadata lists (`meta`) under
    the declared keys (`KEYS`). What nodes pass each other: `split`/`chunks` cut rows for DP ranks
    and micro-batches, `union`/`concat` join them back; no key outside `KEYS` reaches a DAG.
    `held` columns stayed on the workers that computed them (`Held`); reading one (`batch[key]`,
    `index`) fetches it, `split` over its DP size cuts it into the pieces each rank holds.
    `repeats` marks columns (tensor or meta) whose rows come in runs of n equal rows (collate's n
    samples per prompt): the driver sends them as their distinct rows (`compacted`), the workers
    expand them (`expanded`). Operations that keep the runs whole keep the mark; any other drops it
    (the column is then sent as it is)."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, list] = field(default_factory=dict)
    held: dict[str, Held] = field(default_factory=dict)
    repeats: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in (*self.tensors, *self.meta, *self.held):
            assert key in KEYS, f"undeclared batch key {key!r}; declare it with dagrl.core.batch.declare_key"
        sizes = {len(v) for v in (*self.tensors.values(), *self.meta.values(), *self.held.values())}
        assert len(sizes) <= 1, f"batch columns disagree on row count: {sizes}"
        for key, n in self.repeats.items():
            column = self.tensors.get(key, self.meta.get(key))
            assert column is not None and len(column) % n == 0, f"{key}: not in runs of {n} rows"

    def __len__(self) -> int:
        for v in (*self.tensors.values(), *self.meta.values(), *self.held.values()):
            return len(v)
        return 0

    def __getitem__(self, key: str):
        if key in self.held:
            return self.held[key].materialize()
        return self.tensors[key] if key in self.tensors else self.meta[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.meta or key in self.held

    def keys(self) -> set[str]:
        return set(self.tensors) | set(self.meta) | set(self.held)

    def select(self, keys: Iterable[str]) -> Batch:
        keys = set(keys)
        return Batch(
            {k: v for k, v in self.tensors.items() if k in keys},
            {k: v for k, v in self.meta.items() if k in keys},
            {k: v for k, v in self.held.items() if k in keys},
            {k: n for k, n in self.repeats.items() if k in keys},
        )

    def union(self, other: Batch) -> Batch:
        """New batch with the columns of both; a key present in both must not be overwritten."""
        clash = self.keys() & other.keys()
        assert not clash, f"keys produced twice: {sorted(clash)}"
        return Batch(
            {**self.tensors, **other.tensors},
            {**self.meta, **other.meta},
            {**self.held, **other.held},
            {**self.repeats, **other.repeats},
        )

    def repeats_of(
        self, tensors: dict[str, torch.Tensor], meta: dict[str, list] | None = None
    ) -> dict[str, int]:
        """The repeat marks a new batch's columns (`tensors`, and `meta`: this batch's by default)
        keep from this batch: a column keeps its mark while it is the very tensor or list that had
        it, under whatever key."""
        mine = {**self.tensors, **self.meta}
        marked = {id(mine[k]): n for k, n in self.repeats.items()}
        columns = {**tensors, **(self.meta if meta is None else meta)}
        return {k: marked[id(v)] for k, v in columns.items() if id(v) in marked}

    def compacted(self) -> Batch:
        """The batch as it goes to a worker: each marked column as its distinct rows (`Repeated`)."""
        if not self.repeats:
            return self

        def distinct(key: str, column):
            n = self.repeats.get(key)
            if n is None:
                return column
            rows = column[::n]
            return Repeated(rows.contiguous() if isinstance(rows, torch.Tensor) else rows, n)

        tensors = {k: distinct(k, v) for k, v in self.tensors.items()}
        return Batch(tensors, {k: distinct(k, v) for k, v in self.meta.items()}, self.held)

    def expanded(self) -> Batch:
        """The batch as a worker received it with every `Repeated` column expanded again, and
        marked (`repeats`): a backend may use the runs (vLLM samples a prompt's n rows in one
        request)."""
        columns = (*self.tensors.values(), *self.meta.values())
        if not any(isinstance(v, Repeated) for v in columns):
            return self

        def expand(column):
            return column.expand() if isinstance(column, Repeated) else column

        tensors = {k: expand(v) for k, v in self.tensors.items()}
        marks = {k: v.n for k, v in {**self.tensors, **self.meta}.items() if isinstance(v, Repeated)}
        return Batch(tensors, {k: expand(v) for k, v in self.meta.items()}, self.held, marks)

    def materialized(self) -> Batch:
        """The same columns with every held one as a tensor (fetched when the driver lacks it)."""
        if not self.held:
            return self
        fetched = {k: h.materialize() for k, h in self.held.items()}
        return Batch({**self.tensors, **fetched}, self.meta, repeats=self.repeats)

    def index(self, idx: torch.Tensor | list[int]) -> Batch:
        if self.held:
            return self.materialized().index(idx)
        idx_list = idx.tolist() if isinstance(idx, torch.Tensor) else list(idx)
        idx_t = torch.as_tensor(idx_list, dtype=torch.long)
        return Batch(
            {k: v[idx_t] for k, v in self.tensors.items()},
            {k: [v[i] for i in idx_list] for k, v in self.meta.items()},
        )

    def repeat_interleave(self, n: int) -> Batch:
        """Each row repeated n times in place (row i -> rows i*n .. i*n+n-1); the columns (tensors
        and meta lists) are marked as such (`repeats`), so they travel to the workers once per row
        of `self`."""
        out = self.index([i for i in range(len(self)) for _ in range(n)])
        return Batch(out.tensors, out.meta, repeats={k: n for k in out.keys()} if n > 1 else {})

    def split(self, parts: int) -> list[Batch]:
        """Split into `parts` equal contiguous chunks (DP shards); a held column split over its own
        DP size becomes the piece each rank holds (fetched first otherwise)."""
        size = len(self)
        assert size % parts == 0, f"batch of {size} rows cannot split into {parts} equal DP shards"
        if any(h.part is not None or (h.dp_size != parts and not h.refs) for h in self.held.values()):
            return self.materialized().split(parts)
        step = size // parts
        plain = Batch(self.tensors, self.meta)
        shards = [plain.index(range(i * step, (i + 1) * step)) for i in range(parts)]
        pieces = {k: h.pieces(parts) for k, h in self.held.items()}
        repeats = {k: n for k, n in self.repeats.items() if step % n == 0}  # runs not cut
        return [
            Batch(s.tensors, s.meta, {k: p[i] for k, p in pieces.items()}, repeats)
            for i, s in enumerate(shards)
        ]

    def chunks(self, chunk_size: int) -> list[Batch]:
        """Consecutive chunks of at most chunk_size rows (micro-batches)."""
        return [self.index(range(i, min(i + chunk_size, len(self)))) for i in range(0, len(self), chunk_size)]

    @staticmethod
    def concat(batches: list[Batch]) -> Batch:
        """Rows of `batches` in order; held pieces of DP ranks 0..n-1 join into the whole column."""
        assert batches, "concat of no batches"
        first = batches[0]
        held = {}
        for k in set().union(*(b.held for b in batches)):
            pieces = [b.held.get(k) for b in batches]
            if any(p is None for p in pieces) or [p.part for p in pieces] != list(range(pieces[0].dp_size)):
                # anything but the DP pieces of one column is joined on the driver, as tensors
                return Batch.concat([b.materialized() for b in batches])
            held[k] = Held.join(pieces)
        repeats = {k: n for k, n in first.repeats.items() if all(b.repeats.get(k) == n for b in batches)}
        return Batch(
            {k: torch.cat([b.tensors[k] for b in batches]) for k in first.tensors},
            {k: [x for b in batches for x in b.meta[k]] for k in first.meta},
            held,
            repeats,
        )


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to [B, max_len]; returns (ids, mask)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.as_tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def right_pad(seqs: list[list[int]], pad_id: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad (or cut) token lists to [B, width]; returns (ids, mask)."""
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        kept = s[:width]
        ids[i, : len(kept)] = torch.as_tensor(kept, dtype=torch.long)
        mask[i, : len(kept)] = 1
    return ids, mask


def response_attention(batch: Batch) -> torch.Tensor:
    """[B, R] 1 on every real response token: the forward pass attends to observations too, while
    losses count only response_mask's policy tokens. Single-turn batches: response_mask itself."""
    if "response_attention_mask" in batch:
        return batch["response_attention_mask"]
    return batch["response_mask"]


def sequence_inputs(
    prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask, position_ids [B, P+R] for a forward pass over prompt+response."""
    input_ids = torch.cat([prompts, responses], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


@dataclass
class TeacherInputs:
    """A teacher's forward pass over its own prompt followed by the student's response (OPSD).

    input_ids, attention_mask, position_ids: [B, P' + R].
    response_index: [B, R] long: the teacher's logits at column ``response_index[b, r]`` predict
        response token ``r`` of row ``b``, so ``logits.gather(1, response_index)`` (per vocabulary
        column) lands the teacher's distributions on the student's [B, R] response grid.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_index: torch.Tensor

    def token_coordinates(self, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows [N], columns [N]) of the teacher logits for the N masked response tokens, in
        row-major order of ``response_mask`` (the order ``response_mask.nonzero()`` gives)."""
        rows, resp_cols = response_mask.nonzero(as_tuple=True)
        return rows, self.response_index[rows, resp_cols]


def teacher_sequence_inputs(
    teacher_prompts: torch.Tensor,
    teacher_prompt_mask: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
) -> TeacherInputs:
    """The teacher's input for on-policy (self-)distillation with a privileged prompt (OPSD).

    The teacher reads its own prompt (e.g. problem + reference solution) and then the *same*
    response token ids the student sampled — never re-tokenised text, so teacher and student
    score the identical tokens and their distributions can be compared position by position.
    Rows without a privileged prompt carry the student's prompt here (plain GKD).

    Teacher prompts of a batch are collated to a common width, which may exceed the longest one
    (padding to ``data.max_prompt_length``): the columns that are padding in every row are
    dropped, so the teacher does not run over them. Prompt lengths differ per row and from the
    student's; left padding makes every response start at the same column ``P'``, so response
    token ``r`` is predicted by the logits at ``P' − 1 + r`` in every row.

    Args:
        teacher_prompts: [B, Pt] left-padded teacher prompt ids.
        teacher_prompt_mask: [B, Pt] 1 on teacher prompt tokens.
        responses: [B, R] right-padded student response ids.
        response_mask: [B, R] 1 on response tokens.
    """
    assert teacher_prompt_mask.any(dim=1).all(), "every row needs a teacher prompt (the student's if none)"
    first = int(teacher_prompt_mask.any(dim=0).nonzero()[0])  # first column real in some row
    prompts, prompt_mask = teacher_prompts[:, first:], teacher_prompt_mask[:, first:]
    input_ids, attention_mask, position_ids = sequence_inputs(prompts, prompt_mask, responses, response_mask)
    columns = prompts.shape[1] - 1 + torch.arange(responses.shape[1], device=responses.device)
    return TeacherInputs(input_ids, attention_mask, position_ids, columns.expand_as(responses).contiguous())
