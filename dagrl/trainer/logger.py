"""Step metrics to the console, TensorBoard and metrics.jsonl; printing happens on the driver only."""

from __future__ import annotations

import json
import os
import sys

CONSOLE_KEYS = [
    ("reward/mean", "reward", "{:.3f}"),
    ("reward/std", "±", "{:.3f}"),
    ("val/reward/mean", "val", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("actor/pg_loss", "loss", "{:+.4f}"),
    ("actor/kl_loss", "kl", "{:.4f}"),
    ("distill/divergence", "div", "{:.4f}"),
    ("distill/reverse_kl", "rkl", "{:.4f}"),
    ("actor/entropy", "ent", "{:.3f}"),
    ("weight_sync/s", "sync_s", "{:.3f}"),
    ("timing_s/step", "step_s", "{:.2f}"),
]


def log(msg: str) -> None:
    """The one place the driver prints (rank-0 style)."""
    print(msg, file=sys.stdout, flush=True)


class MetricsLogger:
    def __init__(self, out_dir: str, loggers: list[str], experiment: str):
        os.makedirs(out_dir, exist_ok=True)
        self.console = "console" in loggers
        self.jsonl_path = os.path.join(out_dir, "metrics.jsonl")
        self.tb = None
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=os.path.join(out_dir, "tensorboard", experiment))

    def write(self, step: int, metrics: dict[str, float]) -> None:
        with open(self.jsonl_path, "a") as f:
            f.write(json.dumps({"step": step, **metrics}, sort_keys=True) + "\n")
        if self.tb is not None:
            for key, value in metrics.items():
                self.tb.add_scalar(key, value, step)
            self.tb.flush()
        if self.console:
            log(format_line(step, metrics))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def format_line(step: int, metrics: dict[str, float]) -> str:
    parts = [f"step {step:>4}"]
    for key, label, fmt in CONSOLE_KEYS:
        if key in metrics:
            parts.append(f"{label} {fmt.format(metrics[key])}")
    nodes = sorted(
        (k[len("timing_s/") :], v)
        for k, v in metrics.items()
        if k.startswith("timing_s/") and k != "timing_s/step"
    )
    if nodes:
        parts.append("| " + " ".join(f"{n} {v:.2f}s" for n, v in nodes))
    return " ".join(parts)
