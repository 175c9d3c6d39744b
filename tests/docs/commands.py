"""The commands README.md and docs/*.md show (`python -m dagrl.main ...`, `bash run_scripts/...`),
as a reader would copy them: continuation lines joined, trailing comments and leading environment
variables dropped, whitespace collapsed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STARTS = re.compile(r"(python3? -m dagrl\.main|bash run_scripts/)")


def documented_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _clean(text: str) -> str:
    text = text[STARTS.search(text).start() :]
    text = re.sub(r"\s+#\s.*$", "", text)  # a trailing shell comment
    text = text.split(" && ")[0].split(" | ")[0]
    return " ".join(text.replace("python3 -m", "python -m").split())


def commands_in(text: str) -> list[str]:
    """The documented commands of one markdown text, in order."""
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
            found.append(_clean(joined))
        elif not fenced:
            found += [_clean(m) for m in re.findall(r"`([^`]*)`", line) if STARTS.search(m)]
        i += 1
    return found


def documented_commands() -> dict[str, list[str]]:
    """command -> the files (relative to the repository) that show it."""
    out: dict[str, list[str]] = {}
    for path in documented_files():
        for command in commands_in(path.read_text()):
            out.setdefault(command, []).append(str(path.relative_to(ROOT)))
    return out
