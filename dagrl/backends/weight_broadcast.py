"""Weights from the trainer to separate rollout workers by broadcast, in bounded buckets.

The train pool's rank 0 and every worker of the rollout pool join a process group of their own
(NCCL on GPUs, gloo on CPU), built from a TCP store on train rank 0 so it lives beside each pool's
default group. Each bucket of HF-named tensors (at most rollout.weight_sync_bucket_mb, one tensor
may exceed it) goes out as three broadcasts: the length of its layout, the layout (names, dtypes,
shapes, offsets; pickled), then the tensors packed into one byte buffer; a zero length ends the
stream. Receivers unpack views of the buffer and load them into their engine bucket by bucket,
so GPU memory holds one bucket (plus the engine's weights) at a time. The direct path (buckets in
the engine's own layout, both sides knowing the plan) sends each bucket as one broadcast through
two buffers per side, copies overlapping the wire (weight_pipeline.py).
"""

from __future__ import annotations

import datetime
import pickle
import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from dagrl.backends.weight_layout import PackViews, Slot, UnpackViews, bucket_bytes, sources_for
from dagrl.backends.weight_pipeline import BUFFERS, Op, PhaseClock, SyncPhases, schedule

_ALIGN = 16  # byte offset of every tensor in a packed bucket: any dtype's view stays aligned
_TIMEOUT = datetime.timedelta(minutes=30)


class BroadcastGroup:
    """One member of the trainer → rollout broadcast group (rank 0 sends, the others receive)."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, device: torch.device):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.transfer_s, self.transfer_bytes = 0.0, 0  # the last receive's payload broadcasts (the wire)
        self.phases = SyncPhases()  # the last direct send's or receive's time, by phase
        self._unpack_views: UnpackViews | None = None  # a receiver's buffers and views, kept
        self._pack_views: PackViews | None = None  # a sender's recipe for its plan, kept
        self._unpack_key: tuple | None = None
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=_TIMEOUT)
        store = dist.PrefixStore("dagrl-weights/", store)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options.is_high_priority_stream = True
            self.pg = dist.ProcessGroupNCCL(store, rank, world_size, options)
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, world_size, _TIMEOUT)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.pg.broadcast([tensor], opts).wait()

    # ---- sender (train rank 0) ---------------------------------------------------------------
    def send(self, buckets: Iterable[dict[str, torch.Tensor]]) -> int:
        """Broadcast every bucket, then the end marker; returns the payload bytes sent."""
        assert self.rank == 0
        sent = 0
        for bucket in buckets:
            layout, total = pack_layout(bucket)
            meta = torch.frombuffer(bytearray(pickle.dumps(layout)), dtype=torch.uint8)
            self._broadcast(torch.tensor([meta.numel()], dtype=torch.int64, device=self.device))
            self._broadcast(meta.to(self.device))
            self._broadcast(pack(bucket, layout, total, self.device))
            sent += total
        self._broadcast(torch.zeros(1, dtype=torch.int64, device=self.device))
        return sent

    # ---- receivers (rollout workers) ---------------------------------------------------------
    def receive(self, load: Callable[[dict[str, torch.Tensor]], int]) -> int:
        """Receive buckets until the end marker, handing each to `load`; returns what `load`
        reported in all (the bytes the engine took: a tied output layer sent along is skipped)."""
        assert self.rank > 0
        received, self.transfer_s, self.transfer_bytes = 0, 0.0, 0
        while True:
            length = torch.zeros(1, dtype=torch.int64, device=self.device)
            self._broadcast(length)
            if int(length.item()) == 0:
                return received
            meta = torch.empty(int(length.item()), dtype=torch.uint8, device=self.device)
            self._broadcast(meta)
            layout = pickle.loads(meta.cpu().numpy().tobytes())
            total = layout[-1][3] + layout[-1][4] if layout else 0
            buffer = torch.empty(total, dtype=torch.uint8, device=self.device)
            start = self._synced_clock()
            self._broadcast(buffer)
            self.transfer_s += self._synced_clock() - start
            self.transfer_bytes += total
            received += load(unpack(buffer, layout))

    # ---- direct: buckets in the engine's own layout (weight_layout.py) ------------------------
    # Both sides know the plan, so a bucket is one broadcast: no lengths, no layouts, no host
    # synchronisation between buckets. With two buffers per side the copy of one bucket overlaps
    # the broadcast of the other, in the order weight_pipeline.schedule writes down.
    def _start_clock(self) -> float:
        """Sender and receivers leave this together, so each times the same span."""
        self._broadcast(torch.zeros(1, device=self.device))
        return self._synced_clock()

    def _launch(self, tensor: torch.Tensor):
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        return self.pg.broadcast([tensor], opts)

    def send_direct(
        self,
        plan: list[list[tuple[Slot, int]]],
        exported: Iterable[dict[str, torch.Tensor]],
        buffers: int = BUFFERS,
    ) -> int:
        """Broadcast the exported weights in the engine's layout through `buffers` buffers (1: each
        pack waits for the previous broadcast); returns the bytes sent. `phases` says where the
        time went."""
        assert self.rank == 0
        sizes = [bucket_bytes(b) for b in plan]
        if self._pack_views is None or self._pack_views.plan is not plan:
            self._pack_views = PackViews(plan)
        pool = [
            torch.empty(max(sizes, default=0), dtype=torch.uint8, device=self.device) for _ in range(buffers)
        ]
        clock, draw_s, works = PhaseClock(self.device), 0.0, {}
        sources = sources_for(plan, exported)  # draws the whole export
        start = self._start_clock()
        for op, i in schedule(len(plan), buffers, sender=True):
            if op is Op.COPY:
                t = time.perf_counter()
                drawn = next(sources)
                draw_s += time.perf_counter() - t
                begin = clock.mark()
                self._pack_views.pack(i, drawn, pool[i % buffers][: sizes[i]])
                clock.add(begin, clock.mark())
            elif op is Op.LAUNCH:
                works[i] = self._launch(pool[i % buffers][: sizes[i]])
            else:
                works.pop(i).wait()
        next(sources, None)  # drains the export: a sharded trainer exports collectively
        host_s = time.perf_counter() - start
        span = self._synced_clock() - start
        self.phases = SyncPhases(span, clock.read(), 0.0, host_s, draw_s)
        self.transfer_s, self.transfer_bytes = span, sum(sizes)
        return sum(sizes)

    def receive_direct(
        self, plan: list[list[tuple[Slot, int]]], params: dict[str, torch.Tensor], buffers: int = BUFFERS
    ) -> int:
        """Receive every bucket straight into the engine's parameters through `buffers` buffers
        (kept for the next sync, with their views); returns the bytes taken."""
        assert self.rank > 0
        copies = self._copies(plan, params, buffers)
        clock, works, wire_end = PhaseClock(self.device), {}, None
        start = self._start_clock()
        origin = clock.mark()
        for op, i in schedule(len(plan), buffers, sender=False):
            if op is Op.LAUNCH:
                works[i] = self._launch(copies.buffers[i % buffers][: copies.sizes[i]])
            elif op is Op.WAIT:
                works.pop(i).wait()
                if i == len(plan) - 1:  # the current stream passes here once the last broadcast ended
                    wire_end = clock.mark()
            else:
                begin = clock.mark()
                copies.unpack(i)
                clock.add(begin, clock.mark())
        host_s = time.perf_counter() - start
        span = self._synced_clock() - start
        wire = clock.seconds(origin, wire_end) if wire_end is not None else 0.0
        self.phases = SyncPhases(span, clock.read(), wire, host_s)
        self.transfer_s, self.transfer_bytes = span, copies.nbytes
        return copies.nbytes

    def _copies(self, plan, params: dict[str, torch.Tensor], buffers: int) -> UnpackViews:
        """The receive buffers and every unpack's views, made once and reused while the plan, the
        buffer count and the engine's parameters stay the same (per sync they were ~600 Python
        slicing calls on a 0.6B model)."""
        key = (buffers, tuple(p.data_ptr() for p in params.values()))
        if self._unpack_views is None or self._unpack_views.plan is not plan or self._unpack_key != key:
            self._unpack_views, self._unpack_key = None, None  # the old buffers go first
            self._unpack_views, self._unpack_key = UnpackViews(plan, params, buffers, self.device), key
        return self._unpack_views

    def _synced_clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def bandwidth_gbps(self, reps: int = 3) -> float:
        """The group's plain broadcast speed (GB/s of payload), the ceiling for a weight sync."""
        nbytes = (512 if self.device.type == "cuda" else 16) * 2**20  # gloo on 2 cores: keep it short
        buffer = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
        self._broadcast(buffer)  # warm-up: communicator set-up
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            self._broadcast(buffer)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return nbytes * reps / (time.perf_counter() - start) / 1e9


def pack_layout(bucket: dict[str, torch.Tensor]) -> tuple[list[tuple], int]:
    """[(name, dtype, shape, offset, nbytes)] with offsets aligned to 16 bytes, and the total size."""
    layout, offset = [], 0
    for name, tensor in bucket.items():
        nbytes = tensor.numel() * tensor.element_size()
        layout.append((name, tensor.dtype, tuple(tensor.shape), offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return layout, (layout[-1][3] + layout[-1][4]) if layout else 0


def pack(
    bucket: dict[str, torch.Tensor], layout: list[tuple], total: int, device: torch.device
) -> torch.Tensor:
    """The bucket's tensors copied into one uint8 buffer on `device`, at the layout's offsets."""
    buffer = torch.empty(total, dtype=torch.uint8, device=device)
    for name, _, _, offset, nbytes in layout:
        flat = bucket[name].detach().contiguous().view(-1).view(torch.uint8)
        buffer[offset : offset + nbytes].copy_(flat, non_blocking=True)
    return buffer


def unpack(buffer: torch.Tensor, layout: list[tuple]) -> dict[str, torch.Tensor]:
    """Views of `buffer` back as the named tensors (no copy)."""
    return {
        name: buffer[offset : offset + nbytes].view(dtype).view(shape)
        for name, dtype, shape, offset, nbytes in layout
    }
