"""The commands README.md and docs/*.md show (`python -m dagrl.main ...`, `bash run_scripts/...`),
as a reader would copy them: continuation lines joined, trailing comments and leading environment
variables dropped (documented_env keeps those), whitespace collapsed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STARTS = re.compile(r"(python3? -m dagrl\.main|bash run_scripts/)")
ASSIGNMENT = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=(\S*)")


def documented_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _clean(text: str) -> str:
    text = text[STARTS.search(text).start() :]
    text = re.sub(r"\s+#\s.*$", "", text)  # a trailing shell comment
    text = text.split(" && ")[0].split(" | ")[0]
    return " ".join(text.replace("python3 -m", "python -m").split())


def _leading_env(text: str) -> dict[str, str]:
    """The `VAR=value` words written before the command (`CUDA_VISIBLE_DEVICES=0,1 python -m ...`)."""
    return dict(ASSIGNMENT.findall(text[: STARTS.search(text).start()]))


def commands_in(text: str) -> list[str]:
    """The documented commands of one markdown text, in order."""
    return [_clean(shown) for shown in _shown_in(text)]


def _shown_in(text: str) -> list[str]:
    """Each documented command of one markdown text as written (continuation lines joined)."""
    found, fenced, lines = [], False, text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and STARTS.search(line):
            joined = line
            while joined.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                joined = joined.rstrip()[:-1] + " " + lines[i].strip()
            found.append(joined)
        elif not fenced:
            found += [m for m in re.findall(r"`([^`]*)`", line) if STARTS.search(m)]
        i += 1
    return found


def documented_commands() -> dict[str, list[str]]:
    """command -> the files (relative to the repository) that show it."""
    out: dict[str, list[str]] = {}
    for path in documented_files():
        for command in commands_in(path.read_text()):
            out.setdefault(command, []).append(str(path.relative_to(ROOT)))
    return out


def documented_env(command: str) -> dict[str, str]:
    """The environment variables the documents set before `command` (a `documented_commands` key),
    from every place that shows it."""
    env: dict[str, str] = {}
    for path in documented_files():
        for shown in _shown_in(path.read_text()):
            if _clean(shown) == command:
                env.update(_leading_env(shown))
    return env
