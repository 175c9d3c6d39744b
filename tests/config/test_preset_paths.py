"""Presets shipped in the package refer to modules and package files, never to paths read from the
working directory: an installed dagrl runs `experiment=...` from any directory."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import yaml

from dagrl.core.dag import DAG_DIR

PACKAGE = Path(__file__).resolve().parents[2] / "dagrl"
FILE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".jsonl", ".parquet", ".txt", ".sh")


def _leaves(node, key=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{key}[{i}]")
    else:
        yield key, node


def preset_problems(name: str, doc: dict) -> list[str]:
    """What preset `name` (its parsed YAML `doc`) names relative to the working directory, or
    names that does not exist."""
    problems = []
    for key, value in _leaves(doc or {}):
        if not isinstance(value, str) or key.startswith("defaults"):
            continue
        where = f"{name}: {key}={value}"
        if key.startswith("external_plugins"):
            if value.endswith(".py") or "/" in value or importlib.util.find_spec(value) is None:
                problems.append(f"{where}: name an importable module (dagrl.plugins.*), not a file")
        elif key == "dag":
            if not os.path.isfile(os.path.join(DAG_DIR, f"{value}.yaml")):
                problems.append(f"{where}: name a DAG under dagrl/conf/dags")
        elif value.endswith(FILE_SUFFIXES) or value.startswith(("./", "../", "examples/")):
            # relative file paths are package files (dagrl/<path>, as multi_turn.load_tools reads them)
            if os.path.isabs(value) or value.startswith("~") or not (PACKAGE / value).is_file():
                problems.append(f"{where}: not a file of the dagrl package")
    return problems


def test_every_shipped_preset_names_modules_and_package_files_only():
    presets = sorted((PACKAGE / "conf").rglob("*.yaml"))
    assert len(presets) > 20
    problems = [
        p
        for preset in presets
        for p in preset_problems(str(preset.relative_to(PACKAGE)), yaml.safe_load(preset.read_text()))
    ]
    assert not problems, "\n".join(problems)


def test_the_scan_catches_a_cwd_relative_plugin_dag_and_file():
    doc = yaml.safe_load(
        "external_plugins: [examples/multi_turn/python_tool_prompt.py]\n"
        "dag: examples/opsd/gkd_opsd.yaml\n"
        "actor_rollout_ref: {rollout: {multi_turn: {tool_config_path: my_tools.yaml}}}\n"
    )
    assert len(preset_problems("x.yaml", doc)) == 3
