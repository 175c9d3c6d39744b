"""Weights straight into the engine's own parameters: the layout of a direct refresh.

A separate rollout engine receiving HF-named buckets must hand every tensor to its loader
(vLLM's `load_weights` fuses q/k/v and gate/up, one Python call per tensor); on a 0.6B model
that is ~20 ms of CPU work per refresh, several times the broadcast itself. Yet with rollout
TP=1 each HF tensor lands unchanged as a run of rows of one engine parameter. So the map is
learnt once, from the engine's own loader, and every later refresh broadcasts buckets laid out
exactly like the engine's parameters and copies each straight into place.

Learning the map (`RecipeBuilder`), during the first, ordinary refresh, bucket by bucket: each
HF tensor of the bucket is replaced by a probe of random values (seeded, in its dtype), the
probes go through the engine's loader, and each probe is found again among the parameters
(same trailing shape, first row located, whole run compared bit for bit); then the real bucket
is loaded and every learnt run is checked against the real values. The map is used only when
the runs within each engine parameter do not overlap (rows no run covers, such as a padded
vocabulary's spare rows, are left as they are, as the loader leaves them or zero-fills them); anything else (a loader that
transforms values, TP shards cut along columns, a probe found twice) keeps the ordinary path,
and `RecipeBuilder.reason` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

_ALIGN = 16  # byte offset of every parameter in a bucket, as in weight_broadcast.pack_layout


@dataclass(frozen=True)
class Piece:
    """Rows [src_row, src_row + rows) of HF tensor `source` fill rows [row, row + rows) of its
    engine parameter (src_row > 0 only where the plan cut a parameter larger than a bucket)."""

    source: str
    row: int
    rows: int
    src_row: int = 0


@dataclass(frozen=True)
class Slot:
    """One engine parameter and the HF tensors it is made of, in row order."""

    param: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]

    @property
    def row_bytes(self) -> int:
        return _numel(self.shape[1:]) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes that travel: the rows the loader writes (not a padded vocabulary's spare rows)."""
        return sum(p.rows for p in self.pieces) * self.row_bytes


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A tensor as [rows, row width] (a 0-dim tensor is one row of one)."""
    return t.reshape(t.shape[0] if t.dim() else 1, -1)


def find_rows(param: torch.Tensor, probe: torch.Tensor) -> list[int]:
    """Every first row r at which `param[r : r + len(probe)]` equals `probe` bit for bit."""
    if probe.dim() == 0 or param.dim() == 0:
        return (
            [0]
            if param.numel() == probe.numel() == 1 and torch.equal(param.reshape(1), probe.reshape(1))
            else []
        )
    if param.shape[1:] != probe.shape[1:] or param.shape[0] < probe.shape[0] or probe.shape[0] == 0:
        return []
    p, q = _rows(param), _rows(probe.to(param.dtype))
    if q.shape[1] == 1:  # a vector: slide the whole probe over it
        hits = (p[:, 0].unfold(0, q.shape[0], 1) == q[:, 0]).all(1)
    else:
        hits = (p[: p.shape[0] - q.shape[0] + 1] == q[0]).all(1)
    return [int(r) for r in hits.nonzero().flatten() if torch.equal(p[r : r + q.shape[0]], q)]


class RecipeBuilder:
    """Learns, during one ordinary refresh, where each HF tensor lands in the engine's parameters."""

    def __init__(self, params: dict[str, torch.Tensor], seed: int = 0):
        self.params = params
        self.pieces: dict[str, list[Piece]] = {name: [] for name in params}
        self.reason: str | None = None if params else "the engine exposes no parameters"
        self._positions: dict[str, torch.Tensor] | None = None
        self.generator = torch.Generator(device=next(iter(params.values())).device) if params else None
        if self.generator is not None:
            self.generator.manual_seed(seed)

    def _candidates(self, name: str) -> tuple[list[str], list[str]]:
        """Parameters of the same module (q_proj → qkv_proj), and all others (searched only when
        the probe is not among the first)."""
        prefix = name.rsplit(".", 2)[0]
        near = [p for p in self.params if p.rsplit(".", 2)[0] == prefix]
        return near, [p for p in self.params if p.rsplit(".", 2)[0] != prefix]

    def _probe(self, like: torch.Tensor) -> torch.Tensor:
        values = torch.randn(like.shape, generator=self.generator, device=self.generator.device)
        return values.to(like.dtype) if like.is_floating_point() else values.mul(1e6).to(like.dtype)

    def _sample(self) -> dict[str, torch.Tensor]:
        """A fixed few elements of every parameter: enough to see which ones a load wrote."""
        if self._positions is None:
            self._positions = {
                name: torch.randint(p.numel(), (64,), generator=self.generator, device=p.device)
                for name, p in self.params.items()
                if p.numel()
            }
        return {
            name: self.params[name].detach().reshape(-1)[i].clone() for name, i in self._positions.items()
        }

    def observe(
        self, bucket: dict[str, torch.Tensor], load: Callable[[dict[str, torch.Tensor]], object]
    ) -> None:
        """Before `bucket` itself is loaded: load probes of its tensors and find them again."""
        if self.reason is not None:
            return
        probes = {name: self._probe(t) for name, t in bucket.items()}
        before = self._sample()
        load(probes)
        found_here: dict[str, list[Piece]] = {}
        for name, probe in probes.items():
            near, others = self._candidates(name)
            found = [(p, r) for p in near for r in find_rows(self.params[p], probe)]
            found = found or [(p, r) for p in others for r in find_rows(self.params[p], probe)]
            if len(found) > 1:
                self.reason = f"{name} was found {len(found)} times among the engine's parameters"
                return
            if found:  # not found: the engine skips it (e.g. an output layer tied to the embedding)
                param, row = found[0]
                piece = Piece(name, row, probe.shape[0] if probe.dim() else 1)
                self.pieces[param].append(piece)
                found_here.setdefault(param, []).append(piece)
        self._check_writes(before, self._sample(), found_here)

    def _check_writes(self, before: dict, after: dict, found: dict[str, list[Piece]]) -> None:
        """Every element the probes' load changed lies in a run found again (a loader that
        transforms values writes where no probe is found)."""
        for name, positions in self._positions.items():
            changed = (before[name] != after[name]) & ~(before[name].isnan() & after[name].isnan())
            if not changed.any():
                continue
            p = self.params[name]
            rows = positions[changed] // max(p.numel() // (p.shape[0] if p.dim() else 1), 1)
            inside = torch.zeros_like(rows, dtype=torch.bool)
            for piece in found.get(name, []):
                inside |= (rows >= piece.row) & (rows < piece.row + piece.rows)
            if not inside.all():
                self.reason = f"the engine's loader writes {name} with values no HF tensor holds as they are"
                return

    def verify(self, bucket: dict[str, torch.Tensor]) -> None:
        """After `bucket` was loaded for real: every learnt run holds exactly its real values."""
        if self.reason is not None:
            return
        for param, pieces in self.pieces.items():
            for piece in pieces:
                if piece.source in bucket:
                    got = _rows(self.params[param])[piece.row : piece.row + piece.rows]
                    want = _rows(bucket[piece.source].to(self.params[param].dtype))
                    if not torch.equal(got, want):
                        self.reason = f"{piece.source} is not copied unchanged into {param}"
                        return

    def finish(self) -> list[Slot] | None:
        """The slots in parameter order, or None (with `reason`) when runs overlap."""
        if self.reason is not None:
            return None
        sources = [piece.source for pieces in self.pieces.values() for piece in pieces]
        if len(sources) != len(set(sources)):
            self.reason = "an HF tensor lands in more than one engine parameter"
            return None
        slots = []
        for name, tensor in self.params.items():
            pieces = sorted(self.pieces[name], key=lambda p: p.row)
            if not pieces:  # the loader writes nothing there (e.g. a scale it owns): neither do we
                continue
            ends = [p.row + p.rows for p in pieces]
            if not tensor.is_contiguous() or any(p.row < end for p, end in zip(pieces[1:], ends)):
                self.reason = f"the engine parameter {name} is not made of whole HF tensors"
                return None
            slots.append(Slot(name, tensor.dtype, tuple(tensor.shape), tuple(pieces)))
        return slots


def plan_buckets(slots: list[Slot], limit_bytes: int) -> list[list[tuple[Slot, int]]]:
    """Slots grouped in order into buckets of at most limit_bytes, each with its byte offset; a
    slot larger than the limit (an embedding) is cut into runs of rows that fit, so a sync's
    buffers hold `limit_bytes` however large the model's largest parameter (a row larger than the
    limit goes alone)."""
    buckets, bucket, offset = [], [], 0
    for part in (p for slot in slots for p in _cut(slot, limit_bytes)):
        if bucket and offset + part.nbytes > limit_bytes:
            buckets.append(bucket)
            bucket, offset = [], 0
        bucket.append((part, offset))
        offset += -(-part.nbytes // _ALIGN) * _ALIGN
    if bucket:
        buckets.append(bucket)
    return buckets


def _cut(slot: Slot, limit_bytes: int) -> list[Slot]:
    """`slot` as slots of the same parameter of at most limit_bytes each (whole rows)."""
    if slot.nbytes <= limit_bytes:
        return [slot]
    per_part = max(1, limit_bytes // max(slot.row_bytes, 1))
    parts, pieces, room = [], [], per_part
    for piece in slot.pieces:
        done = 0
        while done < piece.rows:
            take = min(room, piece.rows - done)
            pieces.append(Piece(piece.source, piece.row + done, take, piece.src_row + done))
            done, room = done + take, room - take
            if room == 0:
                parts.append(Slot(slot.param, slot.dtype, slot.shape, tuple(pieces)))
                pieces, room = [], per_part
    if pieces:
        parts.append(Slot(slot.param, slot.dtype, slot.shape, tuple(pieces)))
    return parts


def bucket_bytes(bucket: list[tuple[Slot, int]]) -> int:
    slot, offset = bucket[-1]
    return offset + slot.nbytes


def _piece_views(
    bucket: list[tuple[Slot, int]], buffer: torch.Tensor
) -> Iterator[tuple[Slot, Piece, torch.Tensor]]:
    """Each piece's run of the buffer, in the engine's dtype (a slot's pieces back to back)."""
    for slot, offset in bucket:
        for piece in slot.pieces:
            size = piece.rows * slot.row_bytes
            yield slot, piece, buffer[offset : offset + size].view(slot.dtype)
            offset += size


def pack_into(bucket: list[tuple[Slot, int]], sources: dict[str, torch.Tensor], buffer: torch.Tensor) -> None:
    """Copy the HF tensors into `buffer` in the engine's layout (one multi-tensor copy; the copy
    casts when the engine's dtype differs from the trainer's)."""
    views, values = [], []
    for _, piece, view in _piece_views(bucket, buffer):
        views.append(view)
        source = sources[piece.source].detach()
        if piece.src_row or piece.rows != (source.shape[0] if source.dim() else 1):
            source = _rows(source)[piece.src_row : piece.src_row + piece.rows]  # a cut slot's rows
        values.append(source.reshape(-1))
    torch._foreach_copy_(views, values)


class PackViews:
    """A sender's recipe for a plan, made once: for each bucket of one dtype, the runs its buffer
    splits into (alignment gaps included) and, for each piece, its run of its HF tensor's
    elements. A bucket's pack is then one split of the buffer, one flat view per HF tensor and
    one multi-tensor copy; pack_into's slicing, a handful of tensor calls per piece (~3 ms of
    host per sync on a 0.6B model), kept the pipeline's host loop behind the wire. A bucket of
    several dtypes packs through pack_into."""

    def __init__(self, plan: list[list[tuple[Slot, int]]]):
        self.plan = plan  # the plan this recipe was made for (reused only for the same object)
        self.recipes: list[tuple[torch.dtype, list[int], list[int], list[tuple[str, int, int]]] | None] = []
        for bucket in plan:
            dtypes = {slot.dtype for slot, _ in bucket}
            if len(dtypes) != 1:
                self.recipes.append(None)
                continue
            dtype = dtypes.pop()
            item = dtype.itemsize
            sizes, keep, pieces, at = [], [], [], 0  # run lengths (elements), the pieces' runs
            for slot, offset in bucket:
                if offset > at:  # the gap that aligns this slot
                    sizes.append((offset - at) // item)
                    at = offset
                per_row = slot.row_bytes // item
                for piece in slot.pieces:
                    n, start = piece.rows * per_row, piece.src_row * per_row
                    keep.append(len(sizes))
                    sizes.append(n)
                    pieces.append((piece.source, start, start + n))
                    at += n * item
            self.recipes.append((dtype, sizes, keep, pieces))

    def pack(self, i: int, sources: dict[str, torch.Tensor], buffer: torch.Tensor) -> None:
        """Bucket i's HF tensors into `buffer` (its bytes exactly) in the engine's layout."""
        recipe = self.recipes[i]
        if recipe is None:
            pack_into(self.plan[i], sources, buffer)
            return
        dtype, sizes, keep, pieces = recipe
        runs = buffer.view(dtype).split_with_sizes(sizes)
        flats: dict[str, torch.Tensor] = {}
        values = []
        for name, start, stop in pieces:
            flat = flats.get(name)
            if flat is None:
                flat = flats[name] = sources[name].detach().reshape(-1)
            values.append(flat if start == 0 and stop == flat.numel() else flat[start:stop])
        torch._foreach_copy_([runs[j] for j in keep], values)


def unpack_into(
    bucket: list[tuple[Slot, int]], buffer: torch.Tensor, params: dict[str, torch.Tensor]
) -> None:
    """Copy a received bucket into the engine's parameters, exactly the rows the loader writes
    (one multi-tensor copy)."""
    targets, values = [], []
    for slot, piece, view in _piece_views(bucket, buffer):
        flat = params[slot.param].data.view(-1)
        per_row = slot.row_bytes // slot.dtype.itemsize
        targets.append(flat[piece.row * per_row : (piece.row + piece.rows) * per_row])
        values.append(view)
    torch._foreach_copy_(targets, values)


class UnpackViews:
    """A receiver's buffers for a plan and, made once, every unpack's views: the rows of the
    engine's parameters and the runs of the buffer that fill them (bucket i uses buffer
    i % buffers). Reused across syncs while the engine keeps its parameters."""

    def __init__(
        self,
        plan: list[list[tuple[Slot, int]]],
        params: dict[str, torch.Tensor],
        buffers: int,
        device: torch.device,
    ):
        self.plan = plan  # the plan these views were made for (reused only for the same object)
        self.sizes = [bucket_bytes(b) for b in plan]
        self.nbytes = sum(slot.nbytes for bucket in plan for slot, _ in bucket)
        self.buffers = [
            torch.empty(max(self.sizes, default=0), dtype=torch.uint8, device=device) for _ in range(buffers)
        ]
        self.targets, self.values = [], []
        for i, bucket in enumerate(plan):
            targets, values = [], []
            for slot, piece, view in _piece_views(bucket, self.buffers[i % buffers]):
                per_row = slot.row_bytes // slot.dtype.itemsize
                flat = params[slot.param].data.view(-1)
                targets.append(flat[piece.row * per_row : (piece.row + piece.rows) * per_row])
                values.append(view)
            self.targets.append(targets)
            self.values.append(values)

    def unpack(self, i: int) -> None:
        """Bucket i from its buffer into the parameters (one multi-tensor copy)."""
        torch._foreach_copy_(self.targets[i], self.values[i])


def sources_for(
    plan: list[list[tuple[Slot, int]]], exported: Iterable[dict[str, torch.Tensor]]
) -> Iterator[dict[str, torch.Tensor]]:
    """For each planned bucket, the HF tensors it needs, drawn from the trainer's export (whose
    buckets need not line up with the plan's); tensors no slot uses are dropped; the export is
    always drained (a sharded trainer exports collectively)."""
    stream = iter(exported)
    pending: dict[str, torch.Tensor] = {}
    last = {piece.source: i for i, bucket in enumerate(plan) for slot, _ in bucket for piece in slot.pieces}
    for i, bucket in enumerate(plan):
        needed = list(dict.fromkeys(piece.source for slot, _ in bucket for piece in slot.pieces))
        while any(name not in pending for name in needed):
            try:
                pending.update({k: v for k, v in next(stream).items() if k in last})
            except StopIteration:
                missing = [name for name in needed if name not in pending]
                raise RuntimeError(
                    f"the trainer's weights lack {missing[:3]} that the engine expects"
                ) from None
        # a tensor cut over several buckets stays until its last one
        yield {name: pending.pop(name) if last[name] == i else pending[name] for name in needed}
    for _ in stream:
        pass
