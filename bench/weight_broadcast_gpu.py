"""Separate placement's weight broadcast beside a plain broadcast of the same bytes (issue 30:
the sync's GB/s >= 0.8 of the plain broadcast's, between the same two cards, in the same call).

Two processes (cards 0 and 1, NCCL) join dagrl's BroadcastGroup (backends/weight_broadcast.py).
The direct plan is built from a Qwen3 shape's engine parameters as vLLM lays them out at TP=1
(q/k/v fused into qkv_proj, gate/up into gate_up_proj, a tied output layer not sent), computed
from the config's dimensions: no model is built; the trainer's HF tensors are random bf16. Cases,
each the median of --reps after one warm-up, timed as the sync times itself (the receiver's span
from a start both sides leave together to its last copy done):
  floor          one plain broadcast of the plan's bytes;
  plain_buckets  plain broadcasts of the plan's buckets back to back (no copies: the pipeline's ceiling);
  buffers=1      the single-buffer path (each pack waits for the last broadcast, each broadcast for
                 the last unpack), at rollout.weight_sync_bucket_mb's default;
  buffers=2      the pipelined path, at several bucket sizes.
One JSON line per case: GB/s, the ratio to the floor, where the time went (ms: the sender's packs
and host loop, the receiver's wire, unpacks and host loop). Before each sync case the receiver's
parameters are zeroed; after it they are sent back and compared with the sender's own copy of
what the engine should hold: a mismatch fails the run (rc 1).

    python bench/weight_broadcast_gpu.py                      # 2 GPUs: 0.6B and 8B shapes, < 60 s
    python bench/weight_broadcast_gpu.py --cpu --shapes tiny  # gloo, both members on threads
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import sys
import threading

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dagrl.backends.weight_broadcast import BroadcastGroup  # noqa: E402
from dagrl.backends.weight_layout import Piece, Slot, plan_buckets  # noqa: E402
from dagrl.backends.weight_pipeline import SyncPhases  # noqa: E402

# hidden, layers, heads, kv heads, intermediate, vocabulary, tied output layer (head_dim 128)
SHAPES = {
    "0.6b": (1024, 28, 16, 8, 3072, 151936, True),
    "8b": (4096, 36, 32, 8, 12288, 151936, False),
    "tiny": (64, 2, 4, 2, 128, 1000, False),  # the CPU smoke test
}
HEAD_DIM = {"tiny": 16}


def engine_slots(shape: str) -> list[Slot]:
    """The engine's parameters (vLLM's Qwen3 at TP=1) and the HF tensors each is made of."""
    h, layers, heads, kv, inter, vocab, tied = SHAPES[shape]
    hd, bf16 = HEAD_DIM.get(shape, 128), torch.bfloat16

    def slot(name: str, shape: tuple, *parts: tuple[str, int]) -> Slot:
        pieces, row = [], 0
        for source, rows in parts or ((name, shape[0]),):
            pieces.append(Piece(source, row, rows))
            row += rows
        return Slot(name, bf16, shape, tuple(pieces))

    slots = [slot("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        p = f"model.layers.{i}"
        a, m = f"{p}.self_attn", f"{p}.mlp"
        qkv = (
            (f"{a}.q_proj.weight", heads * hd),
            (f"{a}.k_proj.weight", kv * hd),
            (f"{a}.v_proj.weight", kv * hd),
        )
        slots += [
            slot(f"{a}.qkv_proj.weight", ((heads + 2 * kv) * hd, h), *qkv),
            slot(f"{a}.o_proj.weight", (h, heads * hd)),
            slot(f"{a}.q_norm.weight", (hd,)),
            slot(f"{a}.k_norm.weight", (hd,)),
            slot(
                f"{m}.gate_up_proj.weight",
                (2 * inter, h),
                (f"{m}.gate_proj.weight", inter),
                (f"{m}.up_proj.weight", inter),
            ),
            slot(f"{m}.down_proj.weight", (h, inter)),
            slot(f"{p}.input_layernorm.weight", (h,)),
            slot(f"{p}.post_attention_layernorm.weight", (h,)),
        ]
    slots.append(slot("model.norm.weight", (h,)))
    if not tied:
        slots.append(slot("lm_head.weight", (vocab, h)))
    return slots


def hf_tensors(slots: list[Slot], device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(0)
    out = {}
    for s in slots:
        width = s.shape[1:]
        for p in s.pieces:
            out[p.source] = torch.randn((p.rows, *width), generator=g, device=device).to(s.dtype)
    return out


def timed(group: BroadcastGroup, reps: int, once) -> tuple[float, dict]:
    """Median seconds of `once()` (which leaves group.transfer_s), after one warm-up."""
    seconds, phases = [], []
    for _ in range(reps + 1):
        once()
        seconds.append(group.transfer_s)
        phases.append(group.phases)
    seconds = seconds[1:]
    median = statistics.median(seconds)
    p = phases[1 + seconds.index(min(seconds, key=lambda s: abs(s - median)))]
    return median, {k[:-2]: round(v * 1e3, 3) for k, v in vars(p).items() if isinstance(v, float) and v}


def plain(group: BroadcastGroup, sizes: list[int]):
    buffers = [torch.empty(n, dtype=torch.uint8, device=group.device) for n in sizes]

    def once():
        group.phases = SyncPhases()  # none: nothing is copied
        start = group._start_clock()
        works = [group._launch(b) for b in buffers]
        for w in works:
            w.wait()
        group.transfer_s = group._synced_clock() - start
        group.transfer_bytes = sum(sizes)

    return once


def equal_back(group: BroadcastGroup, slots: list[Slot], params: dict, expected: dict | None) -> bool:
    """The receiver's parameters sent back (root 1) and compared on the sender; True there if equal."""
    import torch.distributed as dist

    ok = True
    for s in slots:
        t = params[s.param] if group.rank == 1 else torch.empty_like(expected[s.param])
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 1, 0
        group.pg.broadcast([t], opts).wait()
        if group.rank == 0 and not torch.equal(t, expected[s.param]):
            ok = False
    return ok


def member(rank: int, args, port: int, out: list) -> None:
    device = torch.device("cpu" if args.cpu else f"cuda:{rank}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    group = BroadcastGroup("127.0.0.1", port, rank, 2, device)
    for shape in args.shapes:
        slots = engine_slots(shape)
        params = {s.param: torch.zeros(s.shape, dtype=s.dtype, device=device) for s in slots} if rank else {}
        sources = hf_tensors(slots, device) if rank == 0 else None
        expected = None
        if rank == 0:  # what the engine should hold: each HF tensor at its rows
            expected = {s.param: torch.zeros(s.shape, dtype=s.dtype, device=device) for s in slots}
            for s in slots:
                for p in s.pieces:
                    expected[s.param][p.row : p.row + p.rows] = sources[p.source]
        total = sum(s.nbytes for s in slots)
        floor, _ = timed(group, args.reps, plain(group, [total]))
        cases = [("plain_buckets", 1, args.bucket_mb[-1])]
        cases += [("buffers=1", 1, args.bucket_mb[-1])] + [("buffers=2", 2, mb) for mb in args.bucket_mb]
        for case, buffers, mb in cases:
            plan = plan_buckets(slots, int(mb * 2**20))
            if case == "plain_buckets":
                seconds, phases = timed(
                    group, args.reps, plain(group, [b[-1][1] + b[-1][0].nbytes for b in plan])
                )
                ok = None
            else:
                for p in params.values():
                    p.zero_()
                if rank == 0:
                    once = functools.partial(group.send_direct, plan, [sources], buffers)
                else:
                    once = functools.partial(group.receive_direct, plan, params, buffers)
                seconds, phases = timed(group, args.reps, once)
                ok = equal_back(group, slots, params, expected)
            row = {"shape": shape, "case": case, "bucket_mb": mb, "buckets": len(plan), "bytes": total}
            row |= {"GBps": round(total / seconds / 1e9, 2), "floor_GBps": round(total / floor / 1e9, 2)}
            row |= {"vs_floor": round(floor / seconds, 3), "ms": round(seconds * 1e3, 3)}
            out.append((rank, row, phases, ok))
        group._unpack_views = group._unpack_key = None  # the views hold this shape's parameters
        del params, sources, expected
        if device.type == "cuda":
            torch.cuda.empty_cache()


def spawned(rank: int, args, port: int, queue) -> None:
    out: list = []
    member(rank, args, port, out)
    queue.put(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["0.6b", "8b"])
    ap.add_argument(
        "--bucket-mb", type=float, nargs="+", default=[64, 128, 256], help="the last: buffers=1's"
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU, both members on threads")
    args = ap.parse_args(argv)
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    if args.cpu:
        outs: list = [[], []]
        threads = [threading.Thread(target=member, args=(r, args, port, outs[r])) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=spawned, args=(r, args, port, queue)) for r in range(2)]
        for p in procs:
            p.start()
        outs = [queue.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(timeout=30)
    sender, receiver = sorted(outs, key=lambda o: o[0][0] if o else 0)
    device = "cpu (gloo)" if args.cpu else torch.cuda.get_device_name(0)
    failed = 0
    for (_, row, send_phases, ok), (_, recv_row, recv_phases, _) in zip(sender, receiver, strict=True):
        # the receiver's span is the sync's (weight_sync/broadcast_GBps)
        row = recv_row | {"device": device, "equal": ok}
        row["send_ms"] = {k: v for k, v in send_phases.items() if k in ("copy", "host", "span")}
        row["receive_ms"] = {k: v for k, v in recv_phases.items() if k in ("copy", "wire", "host")}
        failed += ok is False
        print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
