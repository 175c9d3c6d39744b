"""Forward + backward time of the response log-prob / entropy function on one GPU micro-batch:
the Triton kernels, the same math as torch passes over token chunks, and eager torch ops
(gather, fp32 upcast, temperature, log_softmax, entropy) as a plain implementation would write.

    python bench/logprob_kernel.py            # 16 rows x 288 positions, 4096 response tokens, V=151936
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def eager(logits, rows, positions, targets, temperature, vocab_size, entropy):
    z = logits[positions, rows].float()[:, :vocab_size] / temperature
    logp = torch.log_softmax(z, dim=-1)
    lp = logp.gather(1, targets[:, None]).squeeze(1)
    return lp, -(logp.exp() * logp).sum(-1)


def timed(fn, logits, args, reps: int) -> tuple[float, float]:
    """Median ms of forward + backward, and the peak GiB of temporaries: memory above the inputs
    and the logits gradient (which every implementation must allocate)."""
    times = []
    grad_gib = logits.numel() * logits.element_size() / 2**30
    for i in range(reps + 3):
        x = logits.detach().requires_grad_()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        lp, ent = fn(x, *args)
        (lp.sum() + ent.sum()).backward()
        end.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end))
        temporaries = (torch.cuda.max_memory_allocated() - base) / 2**30 - grad_gib
        # lp/ent's graph keeps x (and so x.grad) alive: drop them before the next base reading
        del lp, ent, x
    return statistics.median(times), temporaries


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--seq", type=int, default=288)
    ap.add_argument("--response", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    from dagrl.backends.logprob_kernel import response_logprobs

    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(args.seq, args.rows, args.vocab, device="cuda", generator=g) * 3).to(torch.bfloat16)
    positions = (args.seq - args.response - 1 + torch.arange(args.response, device="cuda")).repeat(args.rows)
    rows = torch.arange(args.rows, device="cuda").repeat_interleave(args.response)
    targets = torch.randint(0, args.vocab, (len(rows),), device="cuda", generator=g)
    call = (rows, positions, targets, args.temperature, args.vocab, True)
    report = {"tokens": len(rows), "vocab": args.vocab, "device": torch.cuda.get_device_name()}
    for name, fn in (("triton", response_logprobs), ("torch_passes", response_logprobs), ("eager", eager)):
        os.environ["DAGRL_LOGPROB_KERNEL"] = "torch" if name == "torch_passes" else "triton"
        ms, peak = timed(fn, logits, call, args.reps)
        report[name] = {"ms": round(ms, 2), "temporaries_gib": round(peak, 2)}
    read = len(rows) * args.vocab * 2 / 1e9
    report["triton"]["GBps_3_passes"] = round(3 * read / report["triton"]["ms"] * 1e3)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
