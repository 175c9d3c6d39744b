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


def test_the_row_says_how_far_the_last_three_steps_stray_from_the_median():
    trl = {**TRL, "step_s": [52.1, 7.0, 6.9, 6.94, 7.1, 6.8]}
    dagrl = {**DAGRL, "step_s": [9.0, 4.1, 4.0, 4.04, 4.5, 3.7]}
    row = side_row("side", "H200", side_text(trl, dagrl))
    assert "trl 6.94 s (last 3: -2 % to +2 %); " in row
    # 4.04 -> 4.5 is +11 %: over issue 29's 10 %, which the row makes plain
    assert "dagrl-torch 4.04 s (0.58x; last 3: -8 % to +11 %)" in row
    short = {**DAGRL, "step_s": [9.0, 4.04, 4.1]}  # too few steps to say
    assert "dagrl-torch 4.04 s (0.58x) |" in side_row("side", "H200", side_text(TRL, short))
