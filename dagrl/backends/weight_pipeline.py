"""The direct refresh as a pipeline: with two buffers per side, the copy of one bucket (the
sender's pack, the receiver's unpack) runs while the other bucket is on the wire.

Stream ordering, as ProcessGroupNCCL gives it: a collective, when launched, makes NCCL's stream
wait for everything queued so far on the current stream; `work.wait()` makes the current stream
wait for the collective's end (no host block). So
- sender: a bucket's broadcast follows its pack (queued before the launch); the pack that
  rewrites a buffer must follow the broadcast that read it: `wait` that broadcast first;
- receiver: an unpack follows its broadcast (`wait` it first); the broadcast that rewrites a
  buffer must follow the unpack that read it: launch it only after that unpack is queued.
Waiting for a broadcast as late as the buffer allows is what lets the copies overlap the wire;
nothing synchronises the host between buckets. On gloo (CPU) the same calls hold: copies run on
the host, `wait` blocks until the broadcast has read or written its buffer.

`schedule` writes the order of these operations down, `check_schedule` states the rules above;
the sender and the receiver run exactly the schedule (the tests check every schedule they run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import torch

BUFFERS = 2  # per side of a direct sync: one bucket's copy beside the other's broadcast


def sync_buffer_bytes(limit_bytes: float, model_bytes: float) -> float:
    """What a separate sync's buffers hold on each side: BUFFERS buckets of at most limit_bytes
    (a larger parameter is cut into rows, weight_layout.plan_buckets), and no more than the model
    (the receiver keeps its buffers between syncs; the sender makes them for each sync)."""
    return BUFFERS * min(limit_bytes, model_bytes)


class Op(str, Enum):
    COPY = "copy"  # sender: pack bucket i into its buffer; receiver: unpack it from its buffer
    LAUNCH = "launch"  # start bucket i's broadcast on its buffer
    WAIT = "wait"  # the current stream (gloo: the host) waits for bucket i's broadcast


Step = tuple[Op, int]  # (operation, bucket index); bucket i uses buffer i % buffers


def schedule(n: int, buffers: int, sender: bool) -> list[Step]:
    """The order of operations of a sender or a receiver of `n` buckets through `buffers` buffers."""
    assert buffers >= 1
    steps: list[Step] = []
    if sender:
        for i in range(n):
            if i >= buffers:  # this buffer's last broadcast has read it
                steps.append((Op.WAIT, i - buffers))
            steps += [(Op.COPY, i), (Op.LAUNCH, i)]
        steps += [(Op.WAIT, i) for i in range(max(0, n - buffers), n)]
        return steps
    steps += [(Op.LAUNCH, i) for i in range(min(buffers, n))]
    for i in range(n):
        steps += [(Op.WAIT, i), (Op.COPY, i)]
        if i + buffers < n:  # launched after the unpack that read this buffer is queued
            steps.append((Op.LAUNCH, i + buffers))
    return steps


def check_schedule(steps: list[Step], n: int, buffers: int, sender: bool) -> None:
    """Raise AssertionError where `steps` breaks the stream-ordering rules of the module docstring."""
    launched, waited, copied = set(), set(), set()
    for op, i in steps:
        buf = i % buffers
        earlier = [j for j in range(i - buffers, -1, -buffers)]  # buckets before i on this buffer
        if op is Op.LAUNCH:
            assert i not in launched and all(j in launched for j in range(i)), f"launch {i} out of order"
            if sender:
                assert i in copied, f"broadcast {i} launched before its pack"
            else:
                assert all(j in copied for j in earlier), f"broadcast {i} overwrites buffer {buf} unread"
            launched.add(i)
        elif op is Op.WAIT:
            assert i in launched and i not in waited, f"wait {i} without its broadcast"
            waited.add(i)
        else:
            assert i not in copied
            if sender:
                assert all(j in waited for j in earlier), f"pack {i} rewrites buffer {buf} in flight"
            else:
                assert i in waited, f"unpack {i} before its broadcast ended"
            copied.add(i)
    assert copied == launched == waited == set(range(n)), "every bucket copied, sent and waited once"


class PhaseClock:
    """Seconds of the copies (pack or unpack) of one sync, without a host synchronisation per
    bucket: CUDA events around each copy on the current stream, read once at the end (`read`)
    after the caller has synchronised; on the CPU the host clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: list[tuple] = []
        self.copy_s = 0.0

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def add(self, begin, end) -> None:
        self.spans.append((begin, end))

    def seconds(self, begin, end) -> float:
        return begin.elapsed_time(end) / 1e3 if self.cuda else end - begin

    def read(self) -> float:
        """The copies' total, once the device has finished them."""
        self.copy_s = sum(self.seconds(b, e) for b, e in self.spans)
        return self.copy_s


@dataclass
class SyncPhases:
    """Where one direct sync's time went, on one side (seconds)."""

    span_s: float = 0.0  # the whole transfer, start clock to the last copy done
    copy_s: float = 0.0  # GPU time of the packs (sender) or unpacks (receiver)
    wire_s: float = 0.0  # receiver: start to the end of the last broadcast
    host_s: float = 0.0  # host time of the loop (launching copies and broadcasts)
    draw_s: float = 0.0  # sender: host time drawing the trainer's export
    extra: dict[str, float] = field(default_factory=dict)
