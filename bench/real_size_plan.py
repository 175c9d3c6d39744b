"""What the memory plan says of GRPO at real model sizes, before any GPU: the dry run of
bench/real_size_gpu.py's runs (same shapes, setups and overrides) on a card of a given size.

Writes config-only Qwen3 shapes (tools/random_qwen3.py: config.json and the tokenizer, no
weights), runs `python -m dagrl.main ... trainer.dry_run=true trainer.gpu_memory_gib=CARD` in
process for each card × shape × setup, and prints one markdown row each: whether it fits, the
rollout and update totals (GiB per device), what the trainer keeps between phases on the device
and on the host (checked with the engine's host share against --host), and the choices auto made (recomputation, the optimizer's place, offload).
Runs on a CPU in seconds; bench/real_size_gpu.py measures the same runs on the card.

    python bench/real_size_plan.py                                   # 80 and 141 GiB, every shape and setup
    python bench/real_size_plan.py --cards 80 --shapes 4b --setups torch megatron-cpuopt
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "bench")]

from real_size_gpu import SETUPS, SHAPES, overrides  # noqa: E402

from dagrl.errors import ConfigError  # noqa: E402


def plan_row(card: float, shape: str, setup: str, model: str, args) -> str:
    from omegaconf import OmegaConf

    from dagrl.config.roles import Role
    from dagrl.main import compose
    from dagrl.trainer.setup import prepare

    args.setup = setup
    keys = [o for o in overrides(args, model, args.out, args.plugin) if not o.startswith("external_plugins")]
    keys = [k for k in keys if not k.startswith("reward.functions")]
    try:
        sizes = [f"trainer.gpu_memory_gib={card}", f"trainer.host_memory_gib={args.host}"]
        dcfg = compose([*keys, "trainer.dry_run=true", *sizes])
        prepared = prepare(OmegaConf.to_object(dcfg))
    except ConfigError as exc:
        return f"| {card:g} | {shape} | {setup} | refused: {exc} | | | | |"
    totals = {r.phase: r.total / 2**30 for g in prepared.memory.groups for r in g.rows}
    fits = "yes" if not prepared.warnings else "no (host)" if "host memory" in prepared.warnings[0] else "no"
    kept = prepared.plan.memory_gib.get(Role.train, 0.0)
    host = prepared.plan.offloaded_gib.get(Role.train, 0.0)
    notes = "; ".join(_choice(n) for n in prepared.memory.notes if ": auto -> " in n)
    return (
        f"| {card:g} | {shape} | {setup} | {fits} | {totals.get('rollout', 0):.1f} | "
        f"{totals.get('update', 0):.1f} | {kept:.1f} / {host:.1f} | {notes} |"
    )


def _choice(note: str) -> str:
    """'actor_rollout_ref.model.gradient_checkpointing: auto -> true (...)' -> 'gradient_checkpointing=true'."""
    key, rest = note.split(": auto -> ", 1)
    return f"{key.rsplit('.', 1)[-1]}={rest.split(' ', 1)[0]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cards", nargs="+", type=float, default=[79.2, 139.8], help="GiB per card (H100, H200)")
    ap.add_argument(
        "--host", type=float, default=125.0, help="GiB of host memory per node (the lent machines: 128 GB)"
    )
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    ap.add_argument("--setups", nargs="+", choices=sorted(SETUPS), default=list(SETUPS))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--response", type=int, default=512)
    args = ap.parse_args()
    args.overrides, args.out = [], tempfile.mkdtemp(prefix="real_size_plan_")
    args.plugin = os.path.join(args.out, "unused.py")
    from tools.random_qwen3 import build_random_qwen3

    models = {}
    for shape in args.shapes:
        models[shape] = os.path.join(args.out, f"qwen3-{shape}")
        build_random_qwen3(models[shape], *SHAPES[shape], 151936, head_dim=128, config_only=True)
    print(
        f"{args.prompts} prompts x {args.n} x ({args.prompt} + {args.response}) tokens, vLLM colocated, "
        f"host {args.host:g} GiB"
    )
    print("| card GiB | shape | setup | fits | rollout GiB | update GiB | trainer kept / host GiB | auto |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for card in args.cards:
        for shape in args.shapes:
            for setup in args.setups:
                print(plan_row(card, shape, setup, models[shape], args), flush=True)


if __name__ == "__main__":
    main()
