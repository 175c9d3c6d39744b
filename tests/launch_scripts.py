"""The `python -m dagrl.main` arguments a launch script (run_scripts/*.sh) would run, so a test can
plan them in process: the script runs under bash as users run it, with an interpreter (the
script's PYTHON) that only writes down the argv it was given. A fresh interpreter per planned
command costs seconds of imports on CI's 2 cores; main_in_process then plans the same argv."""

from __future__ import annotations

import subprocess
from pathlib import Path

ARGV_WRITER = '#!/bin/sh\nprintf "%s\\0" "$@" > "$ARGV_FILE"\n'


def dagrl_argv(cmd: list[str], env: dict[str, str], tmp_path: Path, cwd: Path | None = None) -> list[str]:
    """Run `cmd` (bash SCRIPT args...) with `env` in `cwd`; the arguments after `-m dagrl.main` it ran."""
    writer, argv_file = tmp_path / "argv_writer", tmp_path / "argv"
    writer.write_text(ARGV_WRITER)
    writer.chmod(0o755)
    script_env = {**env, "PYTHON": str(writer), "ARGV_FILE": str(argv_file)}
    proc = subprocess.run(cmd, env=script_env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argv = argv_file.read_bytes().decode().split("\0")[:-1]
    assert argv[:2] == ["-m", "dagrl.main"], argv
    return argv[2:]
