"""Faults injected into real `python -m dagrl.main` runs: signals to the driver, a killed worker,
a full disk.

The signal test starts the CLI in its own process (its own local Ray), waits for a step line,
injects the signal, and checks the exit code, the one line that explains it, the seconds to exit,
that the checkpoint on disk verifies, and that no process of the run outlives it. The killed
worker and the full disk need no process of their own: their command lines run in this process.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from dagrl.trainer import checkpoint
from tests.conftest import main_in_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = [
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "trainer.logger=[console]",
    "trainer.progress_bar=false",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.total_training_steps=500",  # far more than any test waits for
]


class Run:
    """A CLI run whose output is collected line by line on a thread."""

    def __init__(self, out_dir, *overrides: str):
        env = dict(os.environ, PYTHONPATH=REPO, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dagrl.main", *FAST, f"trainer.default_local_dir={out_dir}", *overrides],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, prefix: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(ln.startswith(prefix) for ln in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"no line starting {prefix!r}:\n" + "\n".join(self.lines[-40:]))
            time.sleep(0.02)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def exit(self, timeout_s: float = 90) -> tuple[int, float]:
        """(exit code, seconds from now to the exit)."""
        start = time.monotonic()
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the run did not exit:\n" + "\n".join(self.lines[-40:])) from None
        self.reader.join(timeout=10)
        return rc, time.monotonic() - start

    def line(self, prefix: str) -> str:
        hits = [ln for ln in self.lines if ln.startswith(prefix)]
        assert hits, f"no line starting {prefix!r}:\n" + "\n".join(self.lines[-40:])
        return hits[-1]


def assert_no_orphans(procs: list[psutil.Process], timeout_s: float = 20) -> None:
    """Every process the run started (Ray daemons, workers) is gone or a reaped-by-nobody zombie."""
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    alive = [p for p in alive if _running(p)]
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_first_signal_checkpoints_resume_skips_damaged_second_signal_exits_at_once(tmp_path):
    """SIGTERM after step 1 → final checkpoint, exit 143 (ray.init replaces the SIGTERM handler: the
    run's own must be back). A truncated newer checkpoint is then skipped on resume (falling back
    to the SIGTERM one, saying so); there Ctrl-C twice → exit 130 at once, without a checkpoint.
    Neither run leaves a process of its Ray behind (the second one exits through os._exit).

    Two runs, each a fresh interpreter with a Ray of its own (~25 s on CI's 2 cores): the resumed
    run is the one the second signal stops. A final checkpoint written after a fallback, and the
    in-process flag and safe point: tests/trainer/test_checkpoint_integrity.py, test_interrupt.py."""
    run = Run(tmp_path)
    run.wait_for("step    1")
    procs = run.descendants()
    run.proc.send_signal(signal.SIGTERM)
    rc, seconds = run.exit()
    print(f"SIGTERM: exit {rc} after {seconds:.1f}s")
    assert rc == 143, "\n".join(run.lines[-30:])
    stop = run.line("stopped by SIGTERM after step ")
    step = int(stop.split("after step ")[1].split(";")[0])
    assert step >= 1 and f"final checkpoint {tmp_path}/global_step_{step}" in stop
    assert checkpoint.damage(str(tmp_path / f"global_step_{step}")) is None
    assert "Traceback" not in "\n".join(run.lines)
    assert_no_orphans(procs)

    # a newer checkpoint whose weights file was truncated (e.g. a crash of the storage)
    import shutil

    bad = tmp_path / f"global_step_{step + 50}"
    shutil.copytree(tmp_path / f"global_step_{step}", bad)
    os.truncate(bad / "actor" / "model.safetensors", 1000)
    (tmp_path / checkpoint.TRACKER).write_text(str(step + 50))

    run = Run(tmp_path)
    run.wait_for(f"step {step + 1:>4}")
    assert f"checkpoint {bad} is damaged (actor/model.safetensors has 1000 bytes" in run.line(
        "resume: checkpoint"
    )
    assert run.line("resumed from") == f"resumed from {tmp_path}/global_step_{step} at step {step}"
    procs = run.descendants()
    run.proc.send_signal(signal.SIGINT)
    run.wait_for("SIGINT received: stopping after the current step", timeout_s=30)
    run.proc.send_signal(signal.SIGINT)
    rc, seconds = run.exit(timeout_s=30)
    print(f"second SIGINT: exit {rc} after {seconds:.1f}s")
    assert rc == 130, "\n".join(run.lines[-30:])
    run.line("second SIGINT: stopping now, without a final checkpoint")
    assert [n for n in os.listdir(tmp_path) if n.startswith("global_step_")] == [f"global_step_{step}"]
    assert_no_orphans(procs)


@pytest.mark.slow
def test_killed_worker_ends_run_with_one_line(ray_local, tmp_path, capsys):
    """A worker killed after step 1 ends the run with exit 2 and one line naming its role, rank and pid.

    The command line runs in this process on the session's Ray: what a killed worker changes is
    the driver's error path, which is the same in either process, and a fresh interpreter with a
    Ray of its own costs ~15 s on CI's 2 cores. The process-level part of "nothing outlives the
    run" is checked here as what would keep that process alive or hold the cluster: the run's
    worker processes are gone, its CPUs are back in the Ray, and no thread of it is left running.
    How a CLI run tears down a Ray of its own when it exits is the signal tests' check (their runs
    exit through the same sys.exit)."""
    threads = _live_threads()
    free_cpus = ray_local.available_resources().get("CPU")
    before = set(_ray_workers())
    killed: list[tuple[psutil.Process, float]] = []  # (the worker, when it was killed)
    killer = threading.Thread(
        target=_kill_a_worker_after_step_1, args=(tmp_path, before, killed), daemon=True
    )
    killer.start()
    start = time.monotonic()
    rc, out = main_in_process(capsys, *FAST, f"trainer.default_local_dir={tmp_path}")
    killer.join(timeout=5)
    assert killed, f"no worker was killed:\n{out[-3000:]}"
    [(worker, killed_at)] = killed
    seconds = time.monotonic() - killed_at
    print(f"worker SIGKILL: exit {rc} after {seconds:.2f}s (run {time.monotonic() - start:.1f}s)")
    lines = out.splitlines()
    print("\n".join(lines[-3:]))
    assert rc == 2, out[-3000:]
    line = [ln for ln in lines if ln.startswith("error: worker died: ")][-1]
    assert re.match(
        rf"error: worker died: role train\+rollout, rank 0, node [\d.]+ \(pid {worker.pid}\): ", line
    )
    assert "its worker process has died" in line and len(line) < 400, line
    assert seconds < 60
    assert_no_orphans(list(_ray_workers().values()))  # the run's other workers: shut down by its pools
    deadline = time.monotonic() + 10  # the raylet reports freed resources every ~100 ms
    while ray_local.available_resources().get("CPU") != free_cpus and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray_local.available_resources().get("CPU") == free_cpus, "the run kept its placement bundles"
    assert _live_threads() <= threads, f"threads left running: {_live_threads() - threads}"


def _ray_workers() -> dict[int, psutil.Process]:
    """The Ray actor processes (named ray::Worker once an actor runs in them) below this process."""
    found = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if p.name().startswith("ray::Worker"):
                found[p.pid] = p
        except psutil.Error:
            continue
    return found


def _live_threads() -> set[str]:
    """Non-daemon threads: any one left would keep a CLI process from exiting."""
    return {t.name for t in threading.enumerate() if not t.daemon and t.is_alive()}


def _kill_a_worker_after_step_1(out_dir, before: set[int], killed: list, timeout_s: float = 120) -> None:
    """SIGKILL the run's first worker once metrics.jsonl holds step 1 (the driver writes it after
    the step, so training has started and the next call meets a dead actor)."""
    metrics = out_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if metrics.exists() and '"step": 1' in metrics.read_text():
            workers = [p for pid, p in sorted(_ray_workers().items()) if pid not in before]
            if workers:
                killed.append((workers[0], time.monotonic()))
                os.kill(workers[0].pid, signal.SIGKILL)
            return
        time.sleep(0.02)


@pytest.mark.slow
def test_disk_full_at_a_worker_save_is_named_and_cleaned(ray_local, tmp_path, capsys):
    """A 14 MiB disk holds one checkpoint of the tiny model (~10 MiB with AdamW state: preflight
    passes) but not two: the second save fails inside the worker (torch.save: "iostream error")."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=14m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.decode().strip()})")
    try:
        # no signal or process to watch here: the command line in this process, on the session's Ray
        argv = [
            *FAST,
            f"trainer.default_local_dir={mnt}",
            "trainer.save_freq=1",
            "trainer.total_training_steps=3",
        ]
        rc, out = main_in_process(capsys, *argv)
        assert rc == 2, out
        hits = [
            ln
            for ln in out.splitlines()
            if ln.startswith("error: No space left on device while writing actor/")
        ]
        assert hits, out[-3000:]
        line = hits[-1]
        print(line)
        assert "for checkpoint global_step_2" in line and "freed the partial checkpoint" in line, line
        assert "(during saving step 2); full traceback in" in line, line
        # the run's log holds the traceback (main writes it, as for every error during a run)
        assert sorted(os.listdir(mnt)) == ["dagrl.log", "global_step_1", checkpoint.TRACKER, "metrics.jsonl"]
        assert checkpoint.pick(str(mnt), "auto") == str(mnt / "global_step_1")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
