"""Preflight: output dir, free space for a checkpoint, resume_mode, Ray address — before Ray starts."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time

import pytest

from dagrl.errors import ConfigError
from dagrl.trainer import preflight
from dagrl.trainer.setup import prepare
from tests.conftest import compose_config


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_output_dir(value):
    with pytest.raises(ConfigError, match="trainer.default_local_dir"):
        preflight.check_output_dir(value)


def test_file_valued_output_dir(tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    with pytest.raises(ConfigError, match=rf"default_local_dir' = '{f}': is a file; point it at a directory"):
        preflight.check_output_dir(str(f))
    with pytest.raises(ConfigError, match=rf"cannot be created: {f} is a file"):
        preflight.check_output_dir(str(f / "sub" / "dir"))
    assert preflight.check_output_dir(str(tmp_path / "new" / "dir")) == str(tmp_path)  # nothing created
    assert not (tmp_path / "new").exists()


def test_read_only_output_dir(tmp_path):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here ({r.stderr.decode().strip()})")
    try:
        with pytest.raises(ConfigError, match="read-only filesystem"):
            preflight.check_output_dir(str(mnt / "ckpts"))
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_no_room_for_one_checkpoint(tmp_path):
    """On a 2 MiB disk the tiny model's checkpoint (~10 MiB with AdamW state) does not fit."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.decode().strip()})")
    try:
        cfg = compose_config(f"trainer.default_local_dir={mnt}/ckpts", "trainer.save_freq=5")
        with pytest.raises(ConfigError) as info:
            prepare(cfg)
        msg = str(info.value)
        assert "'trainer.default_local_dir'" in msg and "one checkpoint needs about" in msg
        assert (
            "params × 4 bytes × (1 + 2 optimizer/export/critic factor)" in msg
            and "trainer.save_freq=-1" in msg
        )
        prepare(compose_config(f"trainer.default_local_dir={mnt}/ckpts", "trainer.save_freq=-1"))  # no saves
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_critic_doubles_the_checkpoint(tmp_path):
    """PPO's critic (the actor's model by default) is saved beside it: weights and Adam's m, v."""
    out = f"trainer.default_local_dir={tmp_path}"
    sizes = [
        preflight.checkpoint_bytes(p.cfg, p.plan, 1000)[0]
        for p in (prepare(compose_config(out, *o, "trainer.dry_run=true")) for o in ((), ("algorithm=ppo",)))
    ]
    assert sizes == [1000 * 4 * 3, 1000 * 4 * 6]  # fp32: weights + m + v, twice


def test_resume_mode_must_be_a_checkpoint(tmp_path):
    (tmp_path / "not_a_ckpt").mkdir()
    with pytest.raises(ConfigError, match=r"trainer.resume_mode.*trainer_state.json is missing"):
        preflight.check_resume_mode(str(tmp_path / "not_a_ckpt"))
    preflight.check_resume_mode("auto")
    preflight.check_resume_mode("disable")


def test_unreachable_ray_address_fails_fast_naming_the_key(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address in ("127.0.0.1:1", f"127.0.0.1:{port}"):
        start = time.monotonic()
        with pytest.raises(ConfigError, match=r"'trainer.ray_address'.*nothing answers there"):
            prepare(compose_config(f"trainer.ray_address={address}", f"trainer.default_local_dir={tmp_path}"))
        assert time.monotonic() - start < 30
    with pytest.raises(ConfigError, match="host:port"):
        preflight.check_ray_address("no-port-here")


class _Server(threading.Thread):
    """A TCP server on a free local port that is not Ray: `reply` is written to each connection
    (None: accept and stay silent)."""

    def __init__(self, reply: bytes | None):
        super().__init__(daemon=True)
        self.reply, self.sock = reply, socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns = []

    def run(self):
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.conns.append(conn)  # kept open: a silent peer must not look closed
                if self.reply is not None:
                    conn.recv(64)
                    conn.sendall(self.reply)
                    conn.close()


@pytest.mark.parametrize(
    "reply", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b"", None], ids=["http1", "closes", "silent"]
)
def test_an_address_that_answers_but_is_not_ray_is_refused(reply):
    server = _Server(reply)
    server.start()
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"'trainer.ray_address'.*it is not a Ray GCS"):
        preflight.check_ray_address(server.address, timeout_s=2)
    assert time.monotonic() - start < 5
    server.sock.close()


def test_a_ray_head_passes_the_address_check(ray_local):
    preflight.check_ray_address(ray_local.get_runtime_context().gcs_address)


def test_cli_unreachable_ray_address_exits_within_30s(tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    start = time.monotonic()
    r = subprocess.run(
        [
            "python",
            "-m",
            "dagrl.main",
            "trainer.ray_address=127.0.0.1:1",
            f"trainer.default_local_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=repo,
        env=dict(os.environ, PYTHONPATH=repo),
    )
    seconds = time.monotonic() - start
    print(f"unreachable ray_address: exit {r.returncode} after {seconds:.1f}s")
    assert r.returncode == 2 and seconds < 30
    assert "error: config key 'trainer.ray_address' = '127.0.0.1:1': nothing answers there" in r.stdout
