"""Offload by storage: a role's tensors keep their identity (the optimizer, DDP and the model keep
pointing at them) while their bytes wait in host memory between the role's turns on the GPU.

Host buffers are pinned and kept from one offload to the next: a pageable copy runs at a few GB/s
and pinning fresh buffers costs about as much again, so a 0.6B model with its Adam state (3.6 GB)
spent ~1.2 s each way; a copy into a pinned buffer runs at the bus speed.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class HostStore:
    """Moves the storages of device tensors into reusable host buffers and back."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []  # by storage order, kept across offloads
        self._moved: list[tuple[torch.UntypedStorage, torch.device, torch.Tensor]] = []

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
        for i, (storage, device) in enumerate(storages.values()):
            buffer = self._buffer(i, storage.nbytes(), pin=device.type == "cuda")
            buffer.copy_(_bytes_of(storage, device), non_blocking=True)
            self._moved.append((storage, device, buffer))
        if any(device.type == "cuda" for _, device in storages.values()):
            torch.cuda.synchronize()  # the copies must land before the storages go
        for storage, _, _ in self._moved:
            storage.resize_(0)

    def onload(self) -> None:
        """Give every offloaded storage its memory and bytes back."""
        for storage, device, buffer in self._moved:
            storage.resize_(buffer.numel())
            _bytes_of(storage, device).copy_(buffer, non_blocking=True)
        self._moved = []

    def _buffer(self, i: int, nbytes: int, pin: bool) -> torch.Tensor:
        if i < len(self._buffers) and self._buffers[i].numel() == nbytes:
            return self._buffers[i]
        buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        if i < len(self._buffers):
            self._buffers[i] = buffer
        else:
            self._buffers.append(buffer)
        return buffer


def _bytes_of(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over a whole storage (to copy it regardless of the tensors viewing it)."""
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (storage.nbytes(),))
