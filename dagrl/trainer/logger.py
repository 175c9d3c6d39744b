"""Step metrics to the console, TensorBoard, Weights & Biases and metrics.jsonl; printing happens on
the driver only.

One series per directory: a run that starts at step 0 moves an earlier run's metrics.jsonl and
TensorBoard events in the same trainer.default_local_dir to previous_runs/<time>/ (and says so); a run
resumed from a checkpoint at step N appends deliberately, after dropping what the earlier run logged
past step N (TensorBoard's purge_step does the same for its events), and says so too.
"""

from __future__ import annotations

import json
import os
import shutil
import time

from dagrl.console import log  # noqa: F401  (re-exported: the trainer's callers import it here)
from dagrl.errors import ConfigError

CONSOLE_KEYS = [
    ("reward/mean", "reward", "{:.3f}"),
    ("reward/std", "±", "{:.3f}"),
    ("val/reward/mean", "val", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("actor/pg_loss", "loss", "{:+.4f}"),
    ("train/loss", "nll", "{:.4f}"),  # SFT's training NLL (dagrl/objectives/sft.py)
    ("val/loss", "val_nll", "{:.4f}"),  # SFT's validation NLL (the val_loss node)
    ("actor/kl_loss", "kl", "{:.4f}"),
    ("distill/divergence", "div", "{:.4f}"),
    ("distill/reverse_kl", "rkl", "{:.4f}"),
    ("distill/opsd_rows", "opsd_rows", "{:.0f}"),
    ("distill/gkd_rows", "gkd_rows", "{:.0f}"),
    ("dynamic_sampling/rounds", "rounds", "{:.0f}"),
    ("dynamic_sampling/groups_kept", "kept", "{:.0f}"),
    ("actor/entropy", "ent", "{:.3f}"),
    ("weight_sync/s", "sync_s", "{:.3f}"),
    ("timing_s/step", "step_s", "{:.2f}"),
]


def check_loggers(loggers: list[str]) -> None:
    """Before Ray starts: a logger that cannot start is a ConfigError naming trainer.logger and the
    fix. tensorboard must be importable; wandb installed and, unless WANDB_MODE is offline or
    disabled, given credentials (wandb.init would otherwise fail after the workers started, or wait
    for a key typed at a prompt). dagrl refuses rather than switching wandb to offline by itself:
    a run the user expects on their dashboard must not quietly log to disk instead."""
    if "tensorboard" in loggers and not _importable("tensorboard"):
        raise ConfigError(
            "trainer.logger",
            "tensorboard",
            "tensorboard is not installed (torch.utils.tensorboard needs it): pip install tensorboard,"
            f" or drop it from the list: {_without(loggers, 'tensorboard')}",
        )
    if "wandb" not in loggers:
        return
    if not _importable("wandb"):
        raise ConfigError(
            "trainer.logger",
            "wandb",
            f"wandb is not installed: pip install wandb, or drop it from the list: {_without(loggers, 'wandb')}",
        )
    where = wandb_credentials()
    if where is None:
        raise ConfigError(
            "trainer.logger",
            "wandb",
            "wandb has no credentials here (no WANDB_API_KEY, no entry for"
            f" {_wandb_host()} in {_netrc_path()}): export WANDB_API_KEY=<key>, run `wandb login`,"
            " or log offline with WANDB_MODE=offline (wandb sync uploads it later)",
        )


def _without(loggers: list[str], name: str) -> str:
    """The override that logs to the other sinks (console when none is left)."""
    rest = [x for x in loggers if x != name] or ["console"]
    return f"'trainer.logger=[{','.join(rest)}]'"


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # sys.modules[name] = None: the import is blocked
        return False


def wandb_credentials() -> str | None:
    """Where wandb will find what it needs to start, or None: WANDB_MODE offline/disabled needs
    nothing; else WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, or a .netrc entry for the W&B host
    (what `wandb login` writes). Nothing is imported and no network is used."""
    import netrc

    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if mode in ("offline", "dryrun", "disabled"):
        return f"WANDB_MODE={mode}"
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(var):
            return var
    path = _netrc_path()
    try:
        entry = netrc.netrc(path).authenticators(_wandb_host())
    except (OSError, netrc.NetrcParseError):
        return None
    return path if entry and entry[2] else None


def _wandb_host() -> str:
    from urllib.parse import urlsplit

    url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").rstrip("/")
    return urlsplit(url).netloc or url


def _netrc_path() -> str:
    if os.environ.get("NETRC"):
        return os.environ["NETRC"]
    home = os.path.expanduser("~")
    for name in (".netrc", "_netrc"):
        if os.path.exists(os.path.join(home, name)):
            return os.path.join(home, name)
    return os.path.join(home, ".netrc")


class MetricsLogger:
    def __init__(
        self,
        out_dir: str,
        loggers: list[str],
        experiment: str,
        project: str = "dagrl",
        start_step: int = 0,
        run_config: dict | None = None,
    ):
        """start_step: 0 for a fresh run, else the step a resumed run continues after."""
        os.makedirs(out_dir, exist_ok=True)
        self.console = "console" in loggers
        self.jsonl_path = os.path.join(out_dir, "metrics.jsonl")
        tb_dir = os.path.join(out_dir, "tensorboard", experiment)
        if start_step == 0:
            _move_earlier_run(out_dir, [self.jsonl_path, tb_dir])
        else:
            _drop_after(self.jsonl_path, start_step)
            log(
                f"resumed at step {start_step}: appending to {self.jsonl_path} (its rows after that step dropped)"
            )
        self.tb = None
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step hides events an interrupted run logged past its last checkpoint
            self.tb = SummaryWriter(log_dir=tb_dir, purge_step=start_step + 1 if start_step else None)
        self.wandb = None
        if "wandb" in loggers:
            import wandb  # WANDB_MODE=offline writes the run under <out_dir>/wandb without a network

            self.wandb = wandb.init(project=project, name=experiment, dir=out_dir, config=run_config)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        with open(self.jsonl_path, "a") as f:
            f.write(json.dumps({"step": step, **metrics}, sort_keys=True) + "\n")
        if self.tb is not None:
            for key, value in metrics.items():
                self.tb.add_scalar(key, value, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if self.console:
            log(format_line(step, metrics))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _move_earlier_run(out_dir: str, paths: list[str]) -> None:
    """A fresh run must not add a second series to an earlier run's files: move them aside."""
    present = [p for p in paths if os.path.exists(p)]
    if not present:
        return
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(max(os.path.getmtime(p) for p in present)))
    dest = os.path.join(out_dir, "previous_runs", stamp)
    for path in present:
        target = os.path.join(dest, os.path.relpath(path, out_dir))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(path, target)
    log(f"an earlier run's metrics in {out_dir} moved to {dest} (this run starts at step 0)")


def _drop_after(jsonl_path: str, step: int) -> None:
    """Keep the rows of metrics.jsonl up to `step` (a resumed run logs the later steps again)."""
    if not os.path.exists(jsonl_path):
        return
    with open(jsonl_path) as f:
        rows = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
    with open(jsonl_path, "w") as f:
        f.writelines(rows)


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
