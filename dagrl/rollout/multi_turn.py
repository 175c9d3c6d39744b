"""What a rollout backend needs for multi-turn episodes, built once per worker from the
multi_turn section: the tools, the environment factory, the template's delimiters, the limits and
the thread pool that runs environment steps. Backends bring a `Sampler` (their engine) and call
`MultiTurnRollout.generate`; everything else here is engine-agnostic.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from dagrl.errors import ConfigError
from dagrl.rollout.assemble import episode_metrics, trajectories_to_tensors
from dagrl.rollout.episodes import EpisodeLimits, Sampler, run_episodes
from dagrl.rollout.template import turn_template
from dagrl.tools.base import ENVIRONMENTS, MT, PARSERS, TOOLS, Tool, lookup
from dagrl.tools.environment import ToolSettings

ROW_KEYS = ("data_source", "ground_truth", "extra_info")  # what an environment's reset(row) sees


def load_tools(path: str | None) -> dict[str, Tool]:
    """The tools of a tool config file: `tools: [{name: <registered>, config: {kwargs}}]`. A
    relative path is read from the working directory, else from the dagrl package (the shipped
    `conf/tools/*.yaml` live in dagrl/conf)."""
    if path is None:
        return {}
    key = f"{MT}.tool_config_path"
    path = tool_config_file(path)
    try:
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
    except OSError as e:
        raise ConfigError(key, path, f"cannot read the tool config ({e.strerror})") from e
    entries = doc.get("tools") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(key, path, "the file needs a list under `tools:` of {name: ..., config: {...}}")
    tools = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry:
            raise ConfigError(
                f"{path}: tools[{i}]", entry, "each tool is {name: <registered tool>, config: {...}}"
            )
        factory = lookup(TOOLS, entry["name"], f"{path}: tools[{i}].name")
        try:
            tool = factory(**(entry.get("config") or {}))
        except TypeError as e:
            raise ConfigError(f"{path}: tools[{i}].config", entry.get("config"), str(e)) from e
        tools[tool.name] = tool
    return tools


def tool_config_file(path: str) -> str:
    """A relative path missing from the working directory is looked up in the dagrl package, so
    the presets' `conf/tools/*.yaml` work from anywhere; absolute when found."""
    path = os.path.expanduser(path)
    if os.path.isabs(path) or os.path.exists(path):
        return os.path.abspath(path)
    shipped = Path(__file__).resolve().parents[1] / path  # dagrl/conf/tools/*.yaml
    return str(shipped) if shipped.exists() else path


class MultiTurnRollout:
    def __init__(self, mt, tokenizer, max_response_length: int, eos_ids, pad_id: int):
        self.mt, self.tokenizer, self.pad_id = mt, tokenizer, pad_id
        self.tools = load_tools(mt.tool_config_path)
        self.env_factory = lookup(ENVIRONMENTS, mt.environment, f"{MT}.environment")
        self.settings = ToolSettings(
            lookup(PARSERS, mt.format, f"{MT}.format"),
            mt.max_parallel_calls,
            mt.tool_timeout_s,
            mt.episode_tool_timeout_s,
        )
        self.template = turn_template(tokenizer, mt.observation_role, f"{MT}.observation_role")
        self.limits = EpisodeLimits(
            max_response_length,
            mt.max_assistant_turns,
            mt.max_user_turns,
            mt.max_tool_response_length,
            mt.tool_response_truncate_side.value,
            tuple(eos_ids),
            mt.max_tokens_per_turn,
        )
        # episode steps and the tool calls they make run on separate pools: a step waiting on its
        # calls must never hold the thread a call needs
        self.step_pool = ThreadPoolExecutor(mt.tool_workers, thread_name_prefix="dagrl-env")
        self.call_pool = ThreadPoolExecutor(mt.tool_workers, thread_name_prefix="dagrl-tool")

    def generate(self, sampler: Sampler, prompts: list[list[int]], rows: list[dict]) -> tuple[dict, dict]:
        """Episodes for `prompts` on `sampler`: the batch tensors (assemble.py) and metrics."""
        envs = [self.env_factory(self.settings, self.tools, self.call_pool) for _ in prompts]
        start = time.perf_counter()
        trajs = run_episodes(
            sampler,
            prompts,
            envs,
            rows,
            self.template,
            lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
            lambda text: self.tokenizer.encode(text, add_special_tokens=False),
            self.limits,
            self.step_pool,
        )
        seconds = time.perf_counter() - start
        tensors = trajectories_to_tensors(
            trajs, self.limits.max_response_length, self.limits.max_assistant_turns, self.pad_id
        )
        metrics = episode_metrics(trajs)
        policy_tokens = int(tensors["response_mask"].sum())
        metrics["rollout/tokens_per_s"] = policy_tokens / max(seconds, 1e-9)
        return tensors, metrics


def batch_rows(batch, size: int) -> list[dict]:
    """Per-row fields an environment's reset(row) reads (those of ROW_KEYS the batch carries)."""
    present = [k for k in ROW_KEYS if k in batch.meta]
    return [{k: batch.meta[k][i] for k in present} for i in range(size)]
