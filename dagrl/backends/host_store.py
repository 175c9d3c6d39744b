"""Offload by storage: a role's tensors keep their identity (the optimizer, DDP and the model keep
pointing at them) while their bytes wait in host memory between the role's turns on the GPU.

Host buffers are pinned and kept from one offload to the next: a pageable copy runs at a few GB/s
and pinning fresh buffers costs about as much again, so a 0.6B model with its Adam state (3.6 GB)
spent ~1.2 s each way; a copy into a pinned buffer runs at the bus speed.

The storages' bytes go into a few slabs of power-of-two sizes (backends/pinned.py, cut at a slab's
end where one does not fit), not one pinned buffer each: torch's pinned allocator rounds every
block up to a power of two, which took 1.33-1.41x the bytes of per-parameter storages (Qwen3
0.6B-8B) and up to twice those of megatron's one contiguous parameter buffer. The slabs stay the
same from turn to turn; a different set of storage sizes re-packs them. The memory plan counts
`pinned.pinned_bytes(sizes, split=True)` over the same storages.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from dagrl.backends.pinned import Packing, Piece, allocate, pack


class HostStore:
    """Moves the storages of device tensors into reusable pinned host slabs and back."""

    def __init__(self) -> None:
        self._slabs: list[torch.Tensor] = []  # kept across offloads
        self._packing: tuple[tuple[int, ...], bool, Packing] | None = None  # (sizes, pinned, packing)
        self._moved: list[tuple[torch.UntypedStorage, torch.device, int, tuple[Piece, ...]]] = []

    @property
    def holds(self) -> bool:
        """Whether an offload is waiting to be undone."""
        return bool(self._moved)

    def offload(self, tensors: Iterable[torch.Tensor], cpu_too: bool = False) -> None:
        """Copy each distinct storage of `tensors` on a GPU to host memory and free it (empty
        storages, e.g. ones already offloaded, are skipped). `cpu_too`: CPU tensors move as well,
        for CPU tests that check storages are freed and restored exactly (their storages must be
        resizable: not memory-mapped from a checkpoint)."""
        storages: dict[int, tuple[torch.UntypedStorage, torch.device]] = {}
        for t in tensors:
            storage = t.untyped_storage()
            if storage.nbytes() > 0 and (cpu_too or t.device.type != "cpu"):
                storages.setdefault(storage.data_ptr(), (storage, t.device))
        if not storages:
            return
        assert not self._moved, "an offload is waiting to be undone: its slabs are in use"
        on_cuda = any(device.type == "cuda" for _, device in storages.values())
        packing = self._packed(tuple(s.nbytes() for s, _ in storages.values()), pin=on_cuda)
        for (storage, device), places in zip(storages.values(), packing.places):
            source = _bytes_of(storage, device)
            for p in places:
                self._slab(p).copy_(source[p.start : p.start + p.nbytes], non_blocking=True)
            self._moved.append((storage, device, storage.nbytes(), places))
        if on_cuda:
            torch.cuda.synchronize()  # the copies must land before the storages go
        for storage, _, _, _ in self._moved:
            storage.resize_(0)

    def onload(self) -> None:
        """Give every offloaded storage its memory and bytes back."""
        for storage, device, nbytes, places in self._moved:
            storage.resize_(nbytes)
            target = _bytes_of(storage, device)
            for p in places:
                target[p.start : p.start + p.nbytes].copy_(self._slab(p), non_blocking=True)
        self._moved = []

    @property
    def pinned_bytes(self) -> int:
        """Bytes of the host slabs held (pinned on a GPU host)."""
        return sum(s.numel() for s in self._slabs)

    def _packed(self, sizes: tuple[int, ...], pin: bool) -> Packing:
        """The packing of storages of `sizes` bytes: the slabs of the last offload when the sizes
        are the same (every turn of a role), new ones otherwise."""
        if self._packing is None or self._packing[:2] != (sizes, pin):
            self._slabs = []  # released first: the allocator may hand their blocks to the new slabs
            packing = pack(sizes, split=True)
            self._slabs = allocate(packing, pin)
            self._packing = (sizes, pin, packing)
        return self._packing[2]

    def _slab(self, piece: Piece) -> torch.Tensor:
        return self._slabs[piece.slab][piece.offset : piece.offset + piece.nbytes]


def _bytes_of(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over a whole storage (to copy it regardless of the tensors viewing it)."""
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (storage.nbytes(),))
