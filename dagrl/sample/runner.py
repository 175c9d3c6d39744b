"""The sampling job's driver loop: shards of prompts through the sample DAG, filtered, written.

Shard k holds prompts k·shard_size .. (k+1)·shard_size - 1 of the data (in file order, never
shuffled), is sampled with the seed of "step" k+1 (so a rerun samples the same), and is written
as output_dir/shard_{k:05d}.parquet through a temporary file and an atomic rename: a shard file
exists whole or not at all. A restarted job reads sample_state.json (the data, shard size and
sampling settings it was started with; a different one is refused), skips the shards whose file
exists and continues with the first missing one: nothing is lost, nothing written twice.
"""

from __future__ import annotations

import json
import math
import os

import pyarrow as pa
import pyarrow.parquet as pq

from dagrl.config.schema import DagrlConfig
from dagrl.core.batch import Batch
from dagrl.errors import ConfigError
from dagrl.nodes.reward import decode_responses
from dagrl.sample.filter import kept_indices
from dagrl.trainer.logger import log
from dagrl.trainer.loop import collate

STATE = "sample_state.json"


def shard_path(out_dir: str, k: int) -> str:
    return os.path.join(out_dir, f"shard_{k:05d}.parquet")


def job_identity(cfg: DagrlConfig, num_prompts: int) -> dict:
    """What must not change between a job and its restart (else shards would overlap or differ)."""
    s, r = cfg.sample, cfg.actor_rollout_ref.rollout
    return {
        "train_files": cfg.data.train_files
        if cfg.data.train_files is None
        else list(_as_list(cfg.data.train_files)),
        "prompts": num_prompts,
        "shard_size": s.shard_size,
        "n": r.n,
        "seed": cfg.trainer.seed,
        "sampler_type": s.sampler_type.value,
        "filter": s.filter.value,
    }


def _as_list(files) -> list[str]:
    return [files] if isinstance(files, str) else [str(f) for f in files]


def open_job(out_dir: str, identity: dict) -> None:
    """Create output_dir with its state file, or check a restarted job is the same job."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, STATE)
    if os.path.isfile(path):
        with open(path) as f:
            saved = json.load(f)
        changed = {k: (saved.get(k), v) for k, v in identity.items() if saved.get(k) != v}
        if changed:
            raise ConfigError(
                "sample.output_dir",
                out_dir,
                f"holds shards of another sampling job (changed: {changed}); use a new output_dir or "
                "the original settings",
            )
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(identity, f, indent=1)
    os.replace(tmp, path)


def write_shard(rows: list[dict], path: str) -> None:
    """All of `rows` at `path` or nothing: written to a temporary name, then renamed."""
    tmp = path + ".tmp"
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)


def _append_metrics(out_dir: str, row: dict) -> None:
    """One line per written shard in output_dir/metrics.jsonl (timings, tokens/s, reward means)."""
    with open(os.path.join(out_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def run_sampling(cfg: DagrlConfig, runtime, scheduler, raw_rows: list[dict], dataset) -> dict[str, float]:
    """Sample every shard not yet written; returns the job's totals (written and skipped shards,
    the mean rule reward of all samples and of those kept)."""
    s, n = cfg.sample, cfg.actor_rollout_ref.rollout.n
    examples = dataset.examples[: s.max_prompts] if s.max_prompts else dataset.examples
    out_dir = os.path.expanduser(s.output_dir)
    open_job(out_dir, job_identity(cfg, len(examples)))
    shards = math.ceil(len(examples) / s.shard_size)
    dp = math.lcm(*(runtime.role(r).dp_size for r in scheduler.dag.roles()))
    totals = {"sample/shards_written": 0.0, "sample/shards_skipped": 0.0}
    rule, kept_rule = [], []
    for k in range(shards):
        path = shard_path(out_dir, k)
        if os.path.isfile(path):
            totals["sample/shards_skipped"] += 1
            continue
        part = examples[k * s.shard_size : (k + 1) * s.shard_size]
        padded = part + part[: (-len(part)) % dp]  # every DP rank gets rows; the repeats are cut
        batch = collate(padded, runtime.tokenizer.pad_token_id, n, k * s.shard_size, scheduler.dag.source)
        out, metrics = scheduler.run(batch, step=k + 1)
        out = out.index(range(len(part) * n))
        rows, keep = shard_rows(cfg, runtime.tokenizer, part, raw_rows, out)
        write_shard(rows, path)
        _append_metrics(out_dir, {"shard": k, "prompts": len(part), "kept": len(rows), **metrics})
        rule += out["scores"].tolist()
        kept_rule += [out["scores"][i].item() for i in keep]
        totals["sample/shards_written"] += 1
        log(f"shard {k + 1}/{shards}: {len(rows)} of {len(part) * n} samples kept -> {path}")
    if rule:
        totals["sample/reward_mean"] = sum(rule) / len(rule)
        totals["sample/kept_reward_mean"] = sum(kept_rule) / max(1, len(kept_rule))
        totals["sample/kept"] = float(len(kept_rule))
    log(" ".join(f"{k}={v:.4g}" for k, v in totals.items()))
    return totals


def shard_rows(cfg: DagrlConfig, tokenizer, part, raw_rows, out: Batch) -> tuple[list[dict], list[int]]:
    """The kept samples as rows of the trainer's layout (sample in `response`), and their indices."""
    n = cfg.actor_rollout_ref.rollout.n
    scores = out["sample_scores"].tolist()
    keep = kept_indices(scores, n, cfg.sample)
    texts = decode_responses(tokenizer, out["responses"], out["response_mask"])
    rows = []
    for i in keep:
        example = part[i // n]
        source = {k: v for k, v in raw_rows[example.index].items() if k not in ("response", "messages")}
        extra = dict(source.get("extra_info") or {})
        extra.update(sample_index=i % n, source_row=example.index)
        row = {**source, "extra_info": extra, "response": texts[i], "score": scores[i]}
        row["rule_score"] = float(out["scores"][i])
        if "rm_scores" in out.tensors:
            row["orm_score"] = float(out["rm_scores"][i])
        if "prm_scores" in out.tensors:
            row["prm_score"] = float(out["prm_scores"][i])
            steps = out["prm_step_scores"][i]
            row["prm_step_scores"] = [float(v) for v in steps[: int((steps != 0).sum())]]
        rows.append(row)
    return rows, keep


def is_sampling_job(prepared) -> bool:
    """A DAG that runs the `sampler` role is a sampling job (no trainer loop)."""
    from dagrl.config.roles import Role

    return Role.sampler in prepared.plan.roles


def run_job(cfg: DagrlConfig, prepared) -> dict[str, float]:
    """Read the prompts, start the pools, sample every missing shard, stop the pools."""
    from dagrl.backends.hf_model import load_tokenizer, resolve_model_path
    from dagrl.config.roles import Role
    from dagrl.config.validate import data_files
    from dagrl.core.scheduler import Scheduler
    from dagrl.data.builtin_tasks import builtin_rows
    from dagrl.data.parquet import PromptDataset, read_rows
    from dagrl.trainer.setup import launch, rewarder_for

    d = cfg.data
    sampler_model = resolve_model_path(prepared.plan.specs[Role.sampler].model.path)
    tokenizer = load_tokenizer(sampler_model, cfg.actor_rollout_ref.model.trust_remote_code)
    common = dict(
        max_prompt_length=d.max_prompt_length,
        prompt_key=d.prompt_key,
        filter_overlong=d.filter_overlong_prompts,
    )
    if d.train_files is None:
        raw = builtin_rows(d.builtin_task, "train", d.builtin_train_rows, d.seed, teacher_prompts=True)
        dataset = PromptDataset.from_rows(raw, tokenizer, source="built-in task (train)", **common)
    else:
        raw = read_rows(data_files(d.train_files), prompt_key=d.prompt_key)
        dataset = PromptDataset(data_files(d.train_files), tokenizer, **common)
    runtime, pools, bundles = launch(prepared, tokenizer, rewarder_for(cfg))
    scheduler = Scheduler(prepared.dag, runtime)
    try:
        return run_sampling(cfg, runtime, scheduler, raw, dataset)
    finally:
        scheduler.close()
        for pool in pools:
            pool.shutdown()
        bundles.release()
