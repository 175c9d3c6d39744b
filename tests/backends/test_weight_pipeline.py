"""The direct refresh's pipeline: the order of copies and broadcasts (checked against the
stream-ordering rules), parameters larger than a bucket cut into rows, and a real gloo group
(sender and receiver on threads of this process: gloo runs the broadcasts on its own threads, so
two are in flight as on NCCL) carrying plans of 1, 2, 3 and 7 buckets through one and two
buffers, cast from bf16 into fp32.

A sender that rewrites a buffer before its broadcast is done cannot be caught reliably by the
data on gloo (whether the socket already took the bytes is a race); the schedule each side runs
is checked against the rules instead, and a schedule that breaks them is refused."""

from __future__ import annotations

import pytest
import torch

from dagrl.backends import weight_broadcast
from dagrl.backends.weight_broadcast import BroadcastGroup
from dagrl.backends.weight_layout import Piece, Slot, pack_into, plan_buckets, sources_for, unpack_into
from dagrl.backends.weight_pipeline import Op, check_schedule, schedule
from tests.gloo_threads import free_port, on_threads

W = 8  # row width


@pytest.mark.parametrize("buffers", [1, 2, 3])
@pytest.mark.parametrize("sender", [True, False])
def test_every_schedule_keeps_the_stream_rules(buffers, sender):
    for n in range(9):
        check_schedule(schedule(n, buffers, sender), n, buffers, sender)


def test_two_buffers_let_a_copy_run_beside_the_other_broadcast():
    # the sender packs bucket 1 before waiting for broadcast 0; the receiver has broadcast 1 on
    # the wire before it unpacks bucket 0
    send = schedule(3, 2, sender=True)
    assert send.index((Op.COPY, 1)) < send.index((Op.WAIT, 0))
    receive = schedule(3, 2, sender=False)
    assert receive.index((Op.LAUNCH, 1)) < receive.index((Op.COPY, 0))


def test_a_buffer_rewritten_before_its_broadcast_is_done_is_refused():
    send = schedule(3, 2, sender=True)
    early = send.index((Op.COPY, 2))
    send.remove((Op.WAIT, 0))  # the pack of bucket 2 reuses bucket 0's buffer while it is on the wire
    send.insert(early, (Op.WAIT, 0))
    with pytest.raises(AssertionError, match="pack 2 rewrites buffer 0 in flight"):
        check_schedule(send, 3, 2, sender=True)
    receive = schedule(3, 2, sender=False)
    receive.remove((Op.LAUNCH, 2))  # broadcast 2 into bucket 0's buffer before it was unpacked
    receive.insert(2, (Op.LAUNCH, 2))
    with pytest.raises(AssertionError, match="broadcast 2 overwrites buffer 0 unread"):
        check_schedule(receive, 3, 2, sender=False)


def slots() -> list[Slot]:
    """Seven engine parameters, some fused from two HF tensors, of different sizes."""
    out = []
    for k, rows in enumerate([3, 5, 1, 4, 2, 6, 3]):
        pieces = (Piece(f"hf.{k}.a", 0, rows),) + ((Piece(f"hf.{k}.b", rows, 2),) if k % 2 else ())
        out.append(Slot(f"engine.{k}", torch.float32, (rows + 2, W), pieces))
    return out


def hf_weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        p.source: torch.randn(p.rows, W, generator=g).to(torch.bfloat16) for s in slots() for p in s.pieces
    }


def engine_params() -> dict[str, torch.Tensor]:
    return {s.param: torch.zeros(s.shape) for s in slots()}


def expected(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the engine's loader would hold: each HF tensor at its rows, cast to fp32."""
    params = engine_params()
    for slot in slots():
        for p in slot.pieces:
            params[slot.param][p.row : p.row + p.rows] = weights[p.source].float()
    return params


def limit_for(count: int) -> int:
    """The smallest bucket limit that cuts the seven slots into `count` buckets."""
    return next(m for m in range(16, 10**4, 16) if len(plan_buckets(slots(), m)) == count)


def test_a_parameter_larger_than_a_bucket_is_cut_into_rows_that_fit():
    limit = 100  # the largest slot is 8 rows of 32 bytes; three rows fit
    plan = plan_buckets(slots(), limit)
    assert max(b[-1][1] + b[-1][0].nbytes for b in plan) <= limit
    cut = [s for b in plan for s, _ in b if s.param == "engine.5"]
    assert [(p.source, p.row, p.rows, p.src_row) for s in cut for p in s.pieces] == [
        ("hf.5.a", 0, 3, 0),
        ("hf.5.a", 3, 3, 3),
        ("hf.5.b", 6, 2, 0),
    ]
    params, weights = engine_params(), hf_weights(0)
    exported = iter([{k: weights[k] for k in list(weights)[:5]}, {k: weights[k] for k in list(weights)[5:]}])
    for bucket, sources in zip(plan, sources_for(plan, exported), strict=True):
        buffer = torch.empty(bucket[-1][1] + bucket[-1][0].nbytes, dtype=torch.uint8)
        pack_into(bucket, sources, buffer)
        unpack_into(bucket, buffer, params)
    assert all(torch.equal(params[k], v) for k, v in expected(weights).items())


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_pipelined_receive_equals_the_sent_weights_over_gloo(count, monkeypatch):
    def checked(n, buffers, sender):  # every schedule the two sides run keeps the rules
        steps = schedule(n, buffers, sender)
        check_schedule(steps, n, buffers, sender)
        return steps

    monkeypatch.setattr(weight_broadcast, "schedule", checked)
    plan = plan_buckets(slots(), limit_for(count))
    assert len(plan) == count
    cut = any(p.src_row for b in plan for s, _ in b for p in s.pieces)
    assert cut == (count == 7)  # 7: the largest parameters exceed the limit and are cut
    port = free_port()
    got = []
    first = engine_params()

    def member(rank: int) -> None:
        group = BroadcastGroup("127.0.0.1", port, rank, 2, torch.device("cpu"))
        for seed, buffers in [(1, 2), (2, 2), (3, 1), (4, 1)]:  # views kept, then made anew
            params = first if seed < 4 else engine_params()  # the engine's new parameters
            if rank == 0:
                group.send_direct(plan, iter([hf_weights(seed)]), buffers)
            else:
                group.receive_direct(plan, params, buffers)
                got.append({k: v.clone() for k, v in params.items()})

    on_threads(2, member)
    for seed, params in zip([1, 2, 3, 4], got, strict=True):
        assert all(torch.equal(params[k], v) for k, v in expected(hf_weights(seed)).items()), seed
