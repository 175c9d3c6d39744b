"""What NCCL's communicators hold on each device, outside torch's allocator.

Two-GPU runs hold several GiB per process more than the memory plan's 1.0 GiB context
(docs/gpu_acceptance.md, session 24: TP2+SP +3.9 / +4.2 GiB in both phases, its one-GPU reference
within 1 GiB). This measures where it goes, one process per card, reading at each point the device
in use (`torch.cuda.mem_get_info`) less torch's reserved bytes (what the allocator holds is not the
question):

    context     the first tensor: the CUDA context every process pays
    world       the default group's first all-reduce (its communicator made)
    group_1..3  a new group of every rank, its first all-reduce: one more communicator each
    p2p         a send/recv pair between ranks 0 and 1 (NCCL's point-to-point connections)
    singleton   a group of this rank alone, its first all-reduce
    megatron    initialize_model_parallel at --megatron tp|pp, then one all-reduce on each of its
                NCCL groups of more than one rank (what a megatron step's collectives make)

in four modes, fresh processes each: `lazy` (each communicator made at its first collective, as
dagrl's workers join today), `split` (init_process_group with device_id: new groups split from the
default communicator), `split_share` (split, and NCCL_COMM_SPLIT_SHARE_RESOURCES=1: split
communicators share their parent's buffers; NCCL then forbids operations on parent and child at
once, which megatron's overlapped reductions do), `max_ctas_2` (lazy, every communicator capped at
2 CTAs: NCCL's buffers are per channel; megatron takes such caps per group from a YAML). Prints one `COMM {...}` line per mode: per point the
GiB it added on each rank.

    CUDA_VISIBLE_DEVICES=0,1 python bench/comm_memory.py --megatron tp
    python bench/comm_memory.py --backend gloo --megatron none     # the script itself, on CPU
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GIB = 2**30
MODES = ("lazy", "split", "split_share", "max_ctas_2")
# megatron's names for its groups' NCCL options (parallel_state.get_nccl_options)
MEGATRON_GROUP_NAMES = (
    "dp", "dp_cp", "intra_dp_cp", "cp", "hcp", "mp", "tp", "pp", "embd", "pos_embd", "tp_dp_cp", "tp_dp",
    "tp_cp", "ep", "ep_tp", "tp_ep_mp", "tp_ep_pp", "ep_dp", "intra_ep_dp", "inter_ep_dp",
    "intra_dist_opt_instance",
)  # fmt: skip


def nccl_options(mode: str, backend: str):
    """`max_ctas_2`: NCCL options that cap a communicator at 2 CTAs (channels): its buffers are per
    channel; None otherwise (NCCL's defaults)."""
    if mode != "max_ctas_2" or backend != "nccl":
        return None
    options = dist.ProcessGroupNCCL.Options()
    options.config.max_ctas = 2
    return options


def outside_allocator(device: torch.device) -> float:
    """Bytes the device has in use that torch's caching allocator did not reserve."""
    if device.type != "cuda":
        return 0.0
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return float(total - free - torch.cuda.memory_reserved(device))


def megatron_groups(backend: str) -> dict[str, object]:
    """megatron's process groups with more than one rank on `backend`, by getter name."""
    from megatron.core import parallel_state as mpu

    found: dict[str, object] = {}
    for name in sorted(n for n in dir(mpu) if n.startswith("get_") and n.endswith("_group")):
        try:
            group = getattr(mpu, name)()
        except Exception:  # noqa: BLE001 - a getter for a group this layout did not make
            continue
        for i, g in enumerate(group if isinstance(group, list) else [group]):
            if not isinstance(g, dist.ProcessGroup) or dist.get_world_size(g) < 2:
                continue
            if dist.get_backend(g) != backend or any(g is seen for seen in found.values()):
                continue
            found[name[4:] + (f"[{i}]" if isinstance(group, list) else "")] = g
    return found


def worker(rank: int, world: int, port: int, args, mode: str, out: dict) -> None:
    if mode == "split_share":
        os.environ["NCCL_COMM_SPLIT_SHARE_RESOURCES"] = "1"
    device = torch.device("cpu") if args.backend == "gloo" else torch.device("cuda", rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    points: dict[str, float] = {}
    one = torch.ones(1, device=device)
    mark = [outside_allocator(device)]
    points["context"] = mark[0]

    def step(name: str) -> None:
        now = outside_allocator(device)
        points[name] = now - mark[0]
        mark[0] = now
        out[rank] = {k: round(v / GIB, 3) for k, v in points.items()}  # what a later failure leaves

    bound = {"device_id": device} if mode in ("split", "split_share") and device.type == "cuda" else {}
    options = nccl_options(mode, args.backend)
    dist.init_process_group(
        args.backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        pg_options=options,
        **bound,
    )
    dist.all_reduce(one)
    step("world")
    for i in range(1, 4):
        group = dist.new_group(list(range(world)), pg_options=options)
        dist.all_reduce(one, group=group)
        step(f"group_{i}")
    if rank == 0:
        dist.send(one, dst=1)
    elif rank == 1:
        dist.recv(one, src=0)
    step("p2p")
    # a group of one rank each: NCCL 2.28 makes a communicator for it too (NVIDIA/nccl#2363: one
    # that eagerly connects allocates a 512 MiB shared buffer with no peer to use it); megatron
    # makes such groups for every parallel axis of size 1 (DP=1 under TP2, TP=1 under PP2)
    singles = [dist.new_group([r], pg_options=options) for r in range(world)]
    dist.all_reduce(one, group=singles[rank])
    step("singleton")
    if args.megatron != "none":
        from megatron.core import parallel_state as mpu

        sizes = {"tp": {"tensor_model_parallel_size": world}, "pp": {"pipeline_model_parallel_size": world}}
        if options is not None:  # the same cap on every group megatron makes
            path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"nccl_cfgs_{rank}.yaml")
            with open(path, "w") as f:
                f.write("".join(f"{name}: {{max_ctas: 2}}\n" for name in MEGATRON_GROUP_NAMES))
            sizes[args.megatron]["nccl_communicator_config_path"] = path
        mpu.initialize_model_parallel(**sizes[args.megatron])
        step("megatron_init")
        for name, group in megatron_groups(args.backend).items():
            dist.all_reduce(one, group=group)
            step(f"megatron:{name}")
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--megatron", default="tp", choices=["tp", "pp", "none"])
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    assert not unknown, f"--modes: {unknown[0]} is not one of {MODES}"
    failed = 0
    for mode in modes:  # a mode that fails prints what it read and the error; the others still run
        error = None
        with mp.Manager() as manager:
            out = manager.dict()
            try:
                mp.spawn(worker, args=(args.world, free_port(), args, mode, out), nprocs=args.world)
            except Exception as e:  # noqa: BLE001 - reported in the mode's line
                error, failed = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}", failed + 1
            ranks = {str(r): dict(out[r]) for r in sorted(out.keys())}
        total = {r: round(sum(v for k, v in p.items() if k != "context"), 3) for r, p in ranks.items()}
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if args.backend == "nccl" else None
        line = {"mode": mode, "megatron": args.megatron, "world": args.world, "nccl": nccl, "ranks": ranks}
        print("COMM " + json.dumps({**line, "communicators_gib": total, "error": error}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
