"""bench/side_row.py: a side-by-side group's output becomes one row of docs/gpu_acceptance.md
(the slots runner counts a group without a row as failed)."""

from __future__ import annotations

import json

from bench.side_row import side_row

TRL = {"system": "trl", "median_step_s": 6.94, "peak_GiB": 63.0}
DAGRL = {
    "system": "dagrl-torch",
    "extra": "actor_rollout_ref.rollout.name=vllm",
    "median_step_s": 4.04,
    "last": {"perf/device_memory_used_gib": 91.929},
}


def side_text(*runs: dict, rcs=(0, 0)) -> str:
    lines = ["NVIDIA H200"]
    for run, rc in zip(runs, rcs):
        lines += [f"== {run['system']} rc={rc} 120s", "SIDE " + json.dumps(run)]
    return "\n".join(lines)


def test_the_row_gives_each_system_against_the_first():
    row = side_row("side", "NVIDIA H200 (card 0)", side_text(TRL, DAGRL))
    assert (
        row == "| side | NVIDIA H200 (card 0) | 0 | trl 6.94 s; dagrl-torch 4.04 s (0.58x) | 4.04 | 91.93 | |"
    )
    asleep = {**DAGRL, "extra": DAGRL["extra"] + " actor_rollout_ref.rollout.free_cache_engine=true"}
    row = side_row("side_awake", "H100", side_text(DAGRL, {**asleep, "median_step_s": 4.44}))
    assert "dagrl-torch [actor_rollout_ref.rollout.free_cache_engine=true] 4.44 s (1.10x)" in row


def test_a_run_that_failed_or_wrote_no_line_fails_the_row():
    assert side_row("side", "H100", side_text(TRL, DAGRL, rcs=(0, 1))).split("|")[3].strip() == "1"
    only_trl = side_text(TRL) + "\n== dagrl_default rc=137 420s"
    assert side_row("side", "H100", only_trl) == "| side | H100 | 137 | 1 of 2 runs wrote a SIDE line | | | |"


def test_a_line_cut_short_keeps_its_median():
    cut = side_text(TRL, DAGRL)[:-40]  # a log's first 600 characters of the last JSON line
    assert "dagrl-torch 4.04 s (0.58x)" in side_row("side", "H100", cut)
