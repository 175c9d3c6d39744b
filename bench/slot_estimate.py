"""How long each slot of bench/acceptance_slots.sh will take, known before the call runs: a call
whose slot cannot finish by its deadline is refused instead of cut (a cut group costs the whole
call's device time and still has to run again).

A slot's estimate is the sum of its groups' seconds, plus
  - each random-weight model its rows need that is not built yet under /tmp/dagrl_models (one
    slot builds it while the others wait on its lock: every slot that needs it counts it once);
  - where the slot's compile caches are empty (/tmp/dagrl_slots/<cards>/cache: a fresh machine),
    each group's or row's cold figure: vLLM's graphs, Triton's and Inductor's kernels compiled
    rather than loaded.

Every figure is the slowest credible one measured on a real host, in seconds from the group's (or
row's) start on a slot beside three busy ones. "s29" is session 29 (4x H200, 2026-11-28, the
slowest host yet; its logs time every file and row), "s19" session 19 (4x H200, 2026-11-27),
"s25"/"s26"/"s28" 2x H200 leases, "s21"/"s24" 4x H200 ones. H200 hosts only: an H100 runs the 4B
and 8B rows 1.5-2x slower (sessions 20, 23).

    python bench/acceptance_slots.py --estimate [--fresh | --warm] SLOT...   (no GPU needed)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

MODELS = "/tmp/dagrl_models"  # bench/real_size_gpu.py build's directory: qwen3-SHAPE/config.json once built
# the slot's caches empty: one figure for what a group or row compiles rather than loads. s29: vLLM
# compiled the 4B in 30.8 s against 6.9 s loading the 8B's from the cache, and docs_a's three
# engine starts took ~45 s more each than with its cache filled (below)
COLD_S = 60
# a row's ROW_TIMEOUT when none is set (bench/acceptance_gpu.sh's matrix group)
ROW_TIMEOUT_S = 420


@dataclass(frozen=True)
class Seconds:
    """A group's or a row's run: `warm` with its slot's caches filled, `cold` with them empty
    (None: warm + COLD_S; a figure measured on a fresh machine gives both)."""

    warm: float
    cold: float | None = None

    def at(self, cold: bool) -> float:
        return (self.warm + self.cold_extra) if cold else self.warm

    @property
    def cold_extra(self) -> float:
        return COLD_S if self.cold is None else self.cold - self.warm


@dataclass(frozen=True)
class Row:
    """A matrix row: `prep` its dry run, prompts and record (nothing compiled), `run` the run that
    ROW_TIMEOUT bounds, `shapes` the models it builds under MODELS."""

    prep: float
    run: Seconds
    shapes: tuple[str, ...]


# a model's build (bench/real_size_gpu.py build: random weights made on the card, in a process of
# its own, then written). s29: the first 8B row's run began 78 s into its group, a built 8B's 35-47
# s in; the first 4B row's 59 s in, a built 4B's 24-42; gkd's 56 s with the 1.7B build against
# 1.7b-torch's 23 on it. The 0.6B was not timed apart (bench/acceptance_multi_gpu.sh: ~10 s).
BUILD_S = {"8b": 45, "4b": 35, "1.7b": 25, "0.6b": 20}

ROWS = {
    # s29: 327 s for the handover group's run of it (20 steps, its 0.6B build in it); s19 214
    "0.6b-32x8x256": Row(30, Seconds(300), ("0.6b",)),
    # s21: 19.95 s a step; s23 (one H100) 366 s with its build, workers ready in 116 s
    "0.6b-64x8x512": Row(30, Seconds(340), ("0.6b",)),
    # s29: 143.6 s run, 23 s before it; s19 135
    "1.7b-torch": Row(25, Seconds(145), ("1.7b",)),
    # s29, its slot's first 4B compile: cut at 6 of 10 steps (workers ready in 86 s, 6.3 s a step,
    # ~21 s to start and end): ~175 s for 10; s19 160.5 s; s31 on a fresh machine 216.4 s run
    "4b-torch": Row(25, Seconds(175, 220), ("4b",)),
    # s19 202.7 s run; s29 187.4 s, 42 s before it beside three 8B dry runs
    "4b-megatron": Row(45, Seconds(205), ("4b",)),
    # s29 on a fresh machine: 362 s run, 11 s for the ballast's end and the record
    "4b-megatron-80gib": Row(45, Seconds(375, 375), ("4b",)),
    # s29: ROW_TIMEOUT 420 cut it at 9 of 10 steps (workers ready in 163.6 s, step 1 67.9 s, then
    # 20.6 s a step): ~440 s for 10; 47 s before it; s19 408.5 s
    "8b-megatron": Row(50, Seconds(440), ("8b",)),
    # s26: 449 s in all on a built 8B (workers ready in 173 s); s29 383 s run, 35 s before it;
    # s25, the machine's first 8B run: ~490 s (workers ready in 248 s, ten ~22 s steps)
    "8b-torch": Row(45, Seconds(410, 490), ("8b",)),
    # s29: 221.6 s run, 44 s before it; s19 192.5
    "8b-torch-lora": Row(45, Seconds(225), ("8b",)),
    # s29 on a fresh machine: 256.1 s run; s19 243.1
    "8b-megatron-lora": Row(45, Seconds(260, 260), ("8b",)),
    # s31 133.6 s run (beside 8b-torch's build and start), s19 95.1, s29 94.1 (21 s before it)
    "calculator-vllm": Row(25, Seconds(135), ()),
    # s29: 163.5 s run, 23 s before it; s19 149.5
    "sample-vllm-rm": Row(25, Seconds(165), ("0.6b",)),
    # s29: 166.2 s run, 56 s before it with the 1.7B's build (its dry run goes through run.sh)
    "gkd-0.6b-1.7b": Row(35, Seconds(170), ("0.6b", "1.7b")),
}

# the tests groups' files (bench/acceptance_gpu.sh), each from its pytest process's start to its end
FILES = {
    "tests_a": {
        "tests/backends/vllm/test_multi_turn_gpu.py": 80,  # s25; s19 78, s29 57
        "tests/backends/test_contract.py": 41,  # s29; s19 38
        "tests/backends/megatron/test_backend_gpu.py": 86,  # s29; s25 84
        "tests/backends/megatron/test_logprobs_gpu.py": 31,  # s19; s29 27
        # s19 67 s; the call's deadline cut it after ~45 s (s29) and ~55 s (s25): s19's x1.5
        "tests/backends/megatron/test_spec_gpu.py": 100,
    },
    "tests_b1": {  # s29 and s19 on fresh machines: the cold figures
        "tests/backends/torch/test_offload_gpu.py": 25,  # s29; s19 23
        "tests/backends/test_mixed_precision_gpu.py": 193,  # s19; s29 187
        "tests/reliability/test_engine_errors_gpu.py": 266,  # s29; s19 225
    },
    "tests_b2": {
        "tests/backends/vllm/test_vllm_gpu.py": 50,  # s29; s19 49
        "tests/backends/vllm/test_teacher_gpu.py": 90,  # s31 (81 s in pytest); s29 66, s19 43
        "tests/rewards/test_judge_gpu.py": 70,  # s19 47; s29 cut it after ~39 s: s19's x1.5
    },
    "tests_c": {
        "tests/backends/vllm/test_lora_gpu.py": 93,  # s19 (85 s in pytest); s29 67; s30 60 (warm)
        "tests/backends/vllm/test_lora_megatron_gpu.py": 73,  # s29; s19 51 s in pytest; s30 44 (warm)
    },
    # s29: the first of its two tests done ~130 s in, cut at 155 s; s19 151 s for both
    "tests_d": {"tests/e2e/test_dapo_gpu.py": 230},
    # s36: its two tests 87 s in pytest on a warm machine, the group's call 102 s (s35: 113 s in
    # test_backend_gpu.py, the device run made twice)
    "tests_e": {"tests/backends/megatron/test_optimizer_gpu.py": 105},
    "tests_ppo": {
        "tests/backends/torch/test_critic_gpu.py": 140,  # s29; s19 ~80
        "tests/backends/megatron/test_critic_gpu.py": 132,  # s29; s19 107
    },
}
COLD_FILES = {"tests_b1"}  # measured on a fresh machine: no cold allowance on top

GROUPS = {
    **{g: Seconds(sum(f.values()), sum(f.values()) if g in COLD_FILES else None) for g, f in FILES.items()},
    "ray_probe": Seconds(14, 14),  # s29 13-14, s18 10-14 (and its HOLD_S argument)
    "handover": Seconds(330),  # the 0.6b-32x8x256 row and its checks: s29 327 s; s19 214, s18 157
    # s29 376 s; with empty caches s29 and s21 cut it at 506 s (s29: its first two of three
    # commands took 397 s, the third was still running); s19 489 on a fresh machine
    "docs_a": Seconds(395, 540),  # s31 389 s warm
    # s29 cut it at 123 and 155 s, each time in the last of its four commands (the first three ~132
    # s, s19's 93); s19 188 s in all: ~1.4x s19's
    "docs_b": Seconds(260),
    # alone on the host (measured on fresh machines: cold figures)
    "side": Seconds(520, 520),  # s21 cut it at 405 s, TRL's part ~5.5 minutes; s28 434 s; s30 252 (warm)
    "side_64": Seconds(540, 540),  # ~9 minutes: TRL ~5, dagrl ~4; s23 (one H100) 484 s, s28 468, s30 477
    "side_lora": Seconds(440, 440),  # s37 421 s (fresh machine); s16 377, s15 336, s18 313
    "side_algos": Seconds(420, 420),  # s37 364 s (H200, warm caches); s15 (one H100) 377 s
    "side_dapo": Seconds(360, 360),  # not timed: ~6 minutes (DAPO's two rounds a step)
    "side_ppo": Seconds(300, 300),  # not timed: ~5 minutes
    "side_awake": Seconds(340, 340),  # s37 287 s (H200, warm caches): two dagrl runs at 32x8x256
    "side_64_awake": Seconds(480, 480),  # s36 451 s
    "spread": Seconds(500, 500),  # its budget, SPREAD_SECONDS (480) from its start, and its row; s30 474
    "memory": Seconds(560, 560),  # not timed as a group: its run's limit
    "throughput": Seconds(560, 560),  # not timed as a group: its two runs' limits, 280 s each
    # bench/acceptance_multi_gpu.sh: their figures hold their builds and starts (cold = warm)
    # s32 471 s on a fresh 2x H200 with its first row cut at 220 s (8 of 10 steps; its limit now 300)
    "separate": Seconds(500, 500),
    "dp2": Seconds(540, 540),  # not timed as a group: ~9 minutes (its notes)
    "tp": Seconds(405, 405),  # s24 `0,1:tp 2,3:gkd3a` 405 s; s22 325
    # s25 cut it at 446 s in its two-GPU tests (their limit 220 s; the PP2 row's ROW_TIMEOUT 300)
    "pp": Seconds(560, 560),
    "gkd3a": Seconds(405, 405),  # s24 (beside tp) 405 s
    "gkd3b": Seconds(425, 425),  # s24 (beside 8b-megatron) 421 s
    "big": Seconds(560, 560),  # not timed as a group: its ROW_TIMEOUT 480, the 8B build, the dry run
    "big14": Seconds(560, 560),  # as big, the 14B
    "two_nodes": Seconds(360, 360),  # ~6 minutes (its notes)
    "comm": Seconds(175, 175),  # s27 172 s
    "gkd4_colocate": Seconds(515, 515),  # s17 511 s
    "gkd4_split": Seconds(490, 490),  # s17 487 s
    "mega8b": Seconds(560, 560),  # its ROW_TIMEOUT 480 and the 8-GPU plan's dry run
    "mega8b_save": Seconds(360, 360),  # ~6 minutes (its notes)
    "mega8b_resume": Seconds(360, 360),  # ~6 minutes (its notes)
    "dp4": Seconds(540, 540),  # ~9 minutes (its notes)
}
GROUPS["tests_b"] = Seconds(
    GROUPS["tests_b1"].warm + GROUPS["tests_b2"].warm, GROUPS["tests_b1"].warm + GROUPS["tests_b2"].at(True)
)
GROUP_SHAPES = {"handover": ("0.6b",)}  # its row builds the 0.6B under MODELS


@dataclass
class Host:
    """What a call finds on the machine: the shapes built under MODELS, and the slots (by key, as
    /tmp/dagrl_slots/<key>) whose compile caches hold something."""

    built: set[str] = field(default_factory=set)
    warm: set[str] = field(default_factory=set)


def read_host(slots_root: str, models: str = MODELS) -> Host:
    """This machine's state (on a CPU machine: nothing built, every cache empty)."""
    built = {s for s in BUILD_S if os.path.isfile(os.path.join(models, f"qwen3-{s}", "config.json"))}
    warm = set()
    if os.path.isdir(slots_root):
        for key in os.listdir(slots_root):
            if any(files for _, _, files in os.walk(os.path.join(slots_root, key, "cache"))):
                warm.add(key)
    return Host(built, warm)


def warm_host(slots) -> Host:
    """Every model built and the slots' caches filled: a later call of a lease."""
    return Host(set(BUILD_S), {slot.key for slot in slots})


@dataclass
class Estimate:
    """One slot's estimate: its seconds, what they are made of, its rows' runs over ROW_TIMEOUT."""

    label: str
    seconds: float
    parts: list[str]
    cold: bool
    over_timeout: list[tuple[str, float]]


def group_seconds(words: list[str], cold: bool) -> tuple[float, str]:
    """A non-matrix group's seconds and its part of the slot's line."""
    name = words[0]
    if name == "files":  # its files' share of the group, and the group's cold allowance
        group, named = words[1], words[2:]
        share = sum(FILES[group][f] for f in named)
        figure = Seconds(share, share + GROUPS[group].cold_extra)
        label = f"files {group} ({', '.join(os.path.basename(f) for f in named)})"
    elif name == "ray_probe":
        hold = float(words[1]) if len(words) > 1 else 0.0
        figure, label = Seconds(GROUPS[name].warm + hold, GROUPS[name].warm + hold), " ".join(words)
    else:
        figure, label = GROUPS[name], name
    return figure.at(cold), label


def estimate(slot, host: Host, row_timeout: float = ROW_TIMEOUT_S) -> Estimate:
    """`slot` (acceptance_slots.Slot: label, key, groups) on `host`: every build it waits for
    counted once, every group cold where its caches are empty."""
    cold = slot.key not in host.warm
    total, parts, over, builds = 0.0, [], [], set()
    for words in slot.groups:
        rows = words[1:] if words[0] == "matrix" else []
        shapes = [s for r in rows for s in ROWS[r].shapes] + list(GROUP_SHAPES.get(words[0], ()))
        for shape in dict.fromkeys(shapes):
            if shape not in host.built and shape not in builds:
                builds.add(shape)
                total += BUILD_S[shape]
                parts.append(f"the {shape} build {BUILD_S[shape]}")
        if not rows:
            seconds, label = group_seconds(words, cold)
            total += seconds
            parts.append(f"{label} {seconds:.0f}")
        for row in rows:
            run = ROWS[row].run.at(cold)
            total += ROWS[row].prep + run
            parts.append(f"{row} {ROWS[row].prep + run:.0f}")
            if run > row_timeout:
                over.append((row, run))
    return Estimate(slot.label, total, parts, cold, over)


def report(estimates: list[Estimate], deadline_s: float) -> str:
    """The call's estimate, a line per slot."""
    lines = [f"estimate (bench/slot_estimate.py): the groups end {deadline_s:.0f} s after the start"]
    for e in estimates:
        cold = ", caches empty" if e.cold else ""
        lines.append(f"  slot {e.label}: ~{e.seconds:.0f} s ({' + '.join(e.parts)}{cold})")
    return "\n".join(lines)


def refusals(
    estimates: list[Estimate], slots_seconds: float, reserve_s: float, row_timeout: float
) -> list[str]:
    """A line per slot that would not finish: over its deadline, or a row over ROW_TIMEOUT."""
    out, deadline = [], slots_seconds - reserve_s
    for e in estimates:
        if e.seconds > deadline:
            need = math.ceil(e.seconds + reserve_s)
            fix = f"raise SLOTS_SECONDS to {need} (at most 590), " if need <= 590 else ""
            out.append(
                f"slot {e.label}: ~{e.seconds:.0f} s estimated, past its deadline of {deadline:.0f} s"
                f" (SLOTS_SECONDS {slots_seconds:.0f} less {reserve_s:.0f}): {fix}move a group to another slot"
                " or call, or split a tests group (files GROUP FILE...); SLOTS_OVER=1 runs it anyway"
            )
        for row, run in e.over_timeout:
            need = math.ceil((run + 40) / 10) * 10
            out.append(
                f"slot {e.label}: matrix row {row} runs ~{run:.0f} s, past ROW_TIMEOUT {row_timeout:.0f}"
                f" (it would be cut before its last step): set ROW_TIMEOUT={need}; SLOTS_OVER=1 runs it anyway"
            )
    return out


def after(host: Host, slots) -> Host:
    """What a call of `slots` leaves on the machine: their models built, their caches filled."""
    built, warm = set(host.built), set(host.warm)
    for slot in slots:
        for words in slot.groups:
            rows = words[1:] if words[0] == "matrix" else []
            built |= {s for r in rows for s in ROWS[r].shapes} | set(GROUP_SHAPES.get(words[0], ()))
            if words[0] != "ray_probe":
                warm.add(slot.key)
    return Host(built, warm)
