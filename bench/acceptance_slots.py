"""Acceptance groups beside each other on one multi-GPU host, one card (or one set) each: the
runner behind bench/acceptance_slots.sh (its header: usage, isolation, the call plan).

    python bench/acceptance_slots.py OUT SLOT...      SLOT = CARDS:GROUP[+GROUP...], e.g.
        0:tests_a  1:handover+tests_c  2:"matrix 4b-torch"  3:docs_a    or    0:tests_c  2,3:tp
    python bench/acceptance_slots.py --estimate [--fresh | --warm] SLOT...   (no GPU: the check below)

Each slot runs its groups one after the other (bench/acceptance_gpu.sh, or
bench/acceptance_multi_gpu.sh for the multi-GPU ones) in a copy of the checkout of its own, with
its cards as CUDA_VISIBLE_DEVICES, its own TMPDIR (so Ray's temp dir, pytest's and every run
directory), its own vLLM / Triton / Inductor caches, and a deadline: a group still running then
is ended and its row says so. At the end: the slots' rows in OUT/rows.md (docs/gpu_acceptance.md's
columns; the device column names the cards), every log in OUT/logs.tgz, one line per slot.

Before anything starts, each slot's seconds are estimated (bench/slot_estimate.py: the groups'
measured seconds, the models still to build, empty compile caches) and printed; a call with a slot
past its deadline, or a matrix row past ROW_TIMEOUT, is refused (SLOTS_OVER=1 runs it anyway).
`--estimate` prints the same and starts nothing: this machine's models and caches, or none built
and every cache empty (--fresh, a new machine), or all built and filled (--warm, a later call).
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import slot_estimate  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# bench/acceptance_multi_gpu.sh's groups and the cards each needs; every other group is
# bench/acceptance_gpu.sh's, on one card
MULTI_GPU = {
    "separate": 2, "dp2": 2, "tp": 2, "pp": 2, "gkd3a": 2, "gkd3b": 2, "big": 2, "big14": 2, "two_nodes": 2, "comm": 2,
    "gkd4_colocate": 4, "gkd4_split": 4, "mega8b": 4, "mega8b_save": 4, "mega8b_resume": 4, "dp4": 4,
}  # fmt: skip
ONE_GPU = {
    "tests_a", "tests_b", "tests_b1", "tests_b2", "tests_c", "tests_d", "tests_e", "tests_ppo", "handover", "docs_a",
    "docs_b", "matrix", "side", "side_64", "side_dapo", "side_lora", "side_ppo", "side_algos", "side_awake", "side_64_awake",
    "spread", "memory", "throughput", "ray_probe", "files",
}  # fmt: skip
# the tests groups (`files GROUP FILE...` runs some of a group's files)
TESTS_GROUPS = ("tests_a", "tests_b1", "tests_b2", "tests_c", "tests_d", "tests_e", "tests_ppo")
# groups that must own the host: run them in a call of one slot
TIMING = (
    "its figure is a ratio of timings taken one after the other in the call, which neighbours in other"
    " phases would skew; and .anchors/side_by_side.sh works in fixed /tmp paths (model, run directory)"
)
ALONE = {
    "two_nodes": "it starts raylets on the fixed port 6379, writes Ray's address file and stops every Ray on the host",
    "side": TIMING,
    "side_64": TIMING,
    "side_dapo": TIMING,
    "side_ppo": TIMING,
    "side_algos": TIMING,
    "side_lora": TIMING,
    "side_awake": TIMING,
    "side_64_awake": TIMING,
    "spread": "its figures are seconds of vLLM's CPU-bound decode loop, which neighbours' CPU work would move;"
    " and it builds the anchor model in the fixed /tmp/anchor_q06b",
    "separate": "the weight sync's GB/s is held against a raw NCCL broadcast measured after it",
    "dp2": "its scaling is one card's step over two cards' step, measured one after the other",
    "dp4": "its scaling is one card's step over four cards' step, measured one after the other",
}
NEEDS_ANCHORS = ("side", "spread")  # groups (by prefix) that read .anchors/ (and `side`, .base/)
END_RESERVE_S = 20  # after the groups' deadline: ending them, rows, the tarball, ray stop
# a group is not started with less time left than this (SLOTS_MIN_GROUP_S: the CPU test's short groups)
MIN_GROUP_S = float(os.environ.get("SLOTS_MIN_GROUP_S", "30"))
TARBALL_LIMIT = 15 * 2**20  # the device tool brings files of up to 16 MiB back
TAIL_BYTES = 2**20  # a log's last MiB, where the whole would not fit


@dataclass
class Slot:
    cards: list[str]
    groups: list[list[str]]  # each: the group's name and its arguments
    results: list[dict] = field(default_factory=list)
    dirs: dict[str, str] = field(default_factory=dict)  # repo (its copy), tmp, out
    env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return ",".join(self.cards)

    @property
    def key(self) -> str:
        return "_".join(self.cards)


def parse_slot(spec: str) -> Slot:
    """`2,3:dp2`, `0:handover+tests_c`, `2:matrix 4b-torch 1.7b-torch`."""
    cards, sep, groups = spec.partition(":")
    if not sep or not cards or not groups.strip():
        raise ValueError(f"slot {spec!r}: write CARDS:GROUP[+GROUP...], e.g. 0:tests_c or 2,3:dp2")
    return Slot([c.strip() for c in cards.split(",")], [g.split() for g in groups.split("+")])


def refusals(slots: list[Slot]) -> list[str]:
    """Why these slots cannot run together (empty: they can)."""
    out, seen_cards, seen_groups = [], {}, {}
    for slot in slots:
        for card in slot.cards:
            if not card.isdigit():
                out.append(f"slot {slot.label}: card {card!r} is not a card index")
            elif card in seen_cards:
                out.append(f"card {card} is in slots {seen_cards[card]} and {slot.label}: one slot per card")
            seen_cards.setdefault(card, slot.label)
        for words in slot.groups:
            name = words[0] if words else ""
            if name not in ONE_GPU and name not in MULTI_GPU:
                out.append(
                    f"slot {slot.label}: unknown group {name!r}; groups: {sorted(ONE_GPU | set(MULTI_GPU))}"
                )
                continue
            if name == "matrix":  # a misspelt row would cost a call of device time to find
                rows = matrix_rows()
                unknown = [w for w in words[1:] if w not in rows]
                if unknown or len(words) == 1:
                    out.append(f"slot {slot.label}: matrix rows {unknown or 'missing'}; rows: {sorted(rows)}")
            if name == "files":  # what a deadline left of a tests group: a typo costs a call too
                out += files_refusals(slot.label, words[1:])
            need = MULTI_GPU.get(name, 1)
            if len(slot.cards) < need:
                out.append(f"slot {slot.label}: {name} needs {need} cards; give it {need}, e.g. 0,1:{name}")
            if name in ALONE and len(slots) > 1:
                out.append(f"slot {slot.label}: {name} runs alone (a call of this one slot): {ALONE[name]}")
            # multi_gpu_rows keeps each row's JSON under its name on the host (a later group compares
            # with it): the same group twice at once would write one file from two slots
            if name in MULTI_GPU and name in seen_groups:
                out.append(f"{name} is in slots {seen_groups[name]} and {slot.label}: once per call")
            seen_groups.setdefault(name, slot.label)
    heavy = [
        (slot.label, row)
        for slot in slots
        for words in slot.groups
        if words and words[0] == "matrix"
        for row in words[1:]
        if row in host_heavy_rows()
    ]
    if len(heavy) > 1:
        named = ", ".join(f"{row} (slot {label})" for label, row in heavy)
        out.append(
            f"matrix rows {named} each keep 32 GiB or more on the host (bench/gpu_matrix.py HOST_HEAVY):"
            " one of them a call, the host's memory is shared"
        )
    return out


def files_refusals(label: str, words: list[str]) -> list[str]:
    """Why `files GROUP FILE...` would not run (the script checks each file is GROUP's own)."""
    if not words or words[0] not in TESTS_GROUPS:
        return [f"slot {label}: files needs a tests group first ({', '.join(TESTS_GROUPS)}), then its files"]
    if len(words) == 1:
        return [f"slot {label}: files {words[0]}: name the files to run"]
    named = open(os.path.join(REPO, "bench", "acceptance_gpu.sh")).read()
    return [
        f"slot {label}: files {words[0]}: {f} is not a test file bench/acceptance_gpu.sh runs"
        for f in words[1:]
        if not os.path.isfile(os.path.join(REPO, f)) or f not in named
    ]


def matrix_rows() -> set[str]:
    """The rows bench/gpu_matrix.py runs (the `matrix` group's arguments)."""
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import gpu_matrix

    return {*gpu_matrix.ROWS, *gpu_matrix.COMMAND_ROWS, *gpu_matrix.CARD_ROWS}


def host_heavy_rows() -> set[str]:
    """The matrix rows whose plan keeps 32 GiB or more on the host: one of them a call."""
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import gpu_matrix

    return set(gpu_matrix.HOST_HEAVY)


def device_name() -> str:
    """The host's card name (nvidia-smi, not torch: no CUDA context in the runner); cpu without one."""
    if not shutil.which("nvidia-smi"):
        return "cpu"
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
    )
    names = smi.stdout.strip().splitlines()
    return names[0] if smi.returncode == 0 and names else "cpu"


def prepare(slot: Slot, root: str, skip: list[str]) -> None:
    """The slot's directories (its previous call's wiped: returned with that call) and environment."""
    base = os.path.join(root, slot.key)
    dirs = slot.dirs = {name: os.path.join(base, name) for name in ("repo", "tmp", "out")}
    for path in dirs.values():
        shutil.rmtree(path, ignore_errors=True)
    anchors = any(w[0].startswith(NEEDS_ANCHORS) for w in slot.groups)
    # not the wheels (.gpu), nor what earlier runs or tools left in the checkout (.gitignore's folders)
    hidden = {".git", ".gpu", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache"}
    hidden |= {"outputs", "checkpoints", "runs", "build", "dist"}
    hidden |= set() if anchors else {".anchors", ".base"}

    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n in hidden or os.path.realpath(os.path.join(folder, n)) in skip}

    shutil.copytree(REPO, dirs["repo"], symlinks=True, ignore=ignore)
    os.makedirs(dirs["tmp"])
    os.makedirs(dirs["out"])
    cache = os.path.join(base, "cache")  # kept from call to call: the slot's compiled graphs and kernels
    env = slot.env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # ray.init() joins none
    env.update(
        CUDA_VISIBLE_DEVICES=slot.label,
        TMPDIR=dirs["tmp"],  # Ray's temp dir (sockets, address file, logs), pytest's, tempfile's
        RAY_TMPDIR=dirs["tmp"],
        VLLM_CACHE_ROOT=os.path.join(cache, "vllm"),
        TRITON_CACHE_DIR=os.path.join(cache, "triton"),
        TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
        ACCEPTANCE_SLOT=slot.label,
    )


def session_pids(sid: int) -> list[int]:
    """The processes of session `sid` (a group's script and everything it started: `timeout` puts
    its command in a process group of its own, but the session stays)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    pids.append(int(entry))
            except OSError:  # gone meanwhile
                pass
    return pids


def end_session(sid: int, grace_s: float = 5.0) -> None:
    """TERM to what is left of a group's processes, KILL to what is left of them `grace_s` later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = session_pids(sid)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        end = time.time() + grace_s
        while pids and sig == signal.SIGTERM and session_pids(sid) and time.time() < end:
            time.sleep(0.2)


def run_group(slot: Slot, words: list[str], index: int, deadline: float) -> dict:
    """One group in the slot's copy, until it ends or the deadline; what happened to it."""
    name, start = words[0], time.time()
    result = {"group": " ".join(words), "rc": None, "s": 0, "note": ""}
    if deadline - start < MIN_GROUP_S:
        result.update(rc=124, note=f"not started: {deadline - start:.0f} s left before the deadline")
        return result
    script = "acceptance_multi_gpu.sh" if name in MULTI_GPU else "acceptance_gpu.sh"
    env = {**slot.env, "ACCEPTANCE_DEADLINE": str(int(deadline))}
    log = open(os.path.join(slot.dirs["out"], f"{index}.{name}.out"), "w")
    proc = subprocess.Popen(
        ["bash", os.path.join("bench", script), slot.dirs["out"], *words],
        cwd=slot.dirs["repo"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        result["rc"] = proc.wait(timeout=max(deadline - time.time(), 1))
    except subprocess.TimeoutExpired:
        end_session(proc.pid)
        proc.wait()
        result.update(rc=124, note=f"cut by the deadline after {time.time() - start:.0f} s")
    end_session(proc.pid)  # what the group left running (a finished group leaves nothing)
    log.close()
    result["s"] = round(time.time() - start)
    return result


def table_rows(path: str) -> list[str]:
    if not os.path.isfile(path):
        return []
    return [line for line in open(path).read().splitlines() if line.startswith("| ")]


def run_slot(slot: Slot, deadline: float) -> None:
    """The slot's groups one after the other (a thread per slot)."""
    rows = os.path.join(slot.dirs["out"], "rows.md")
    for index, words in enumerate(slot.groups):
        before = len(table_rows(rows))
        try:
            result = run_group(slot, words, index, deadline)
        except Exception as exc:  # noqa: BLE001 - the other slots and the summary go on
            result = {"group": " ".join(words), "rc": 1, "s": 0, "note": f"the runner failed: {exc!r}"}
        # the rows' exit codes are the group's result (a script's own exit code is its last command's)
        result["row_rcs"] = [ln.split("|")[3].strip() for ln in table_rows(rows)[before:]]
        if not result["note"] and not result["row_rcs"]:
            result["note"] = f"exit {result['rc']}, no row written: see {index}.{words[0]}.out"
        slot.results.append(result)


def passed(result: dict) -> bool:
    return not result["note"] and all(rc == "0" for rc in result["row_rcs"])


def merged_rows(slots: list[Slot], device: str) -> str:
    """Every slot's rows, the device column naming its cards; a row for each group the deadline cut
    or that ended without writing one."""
    specs = [f"{s.label}:" + "+".join(" ".join(words) for words in s.groups) for s in slots]
    lines = ["slots (one host, at once): " + "  ".join(specs)]
    for slot in slots:
        where = f"card {slot.label}" if len(slot.cards) == 1 else f"cards {slot.label}"
        for line in table_rows(os.path.join(slot.dirs["out"], "rows.md")):
            cells = line.split("|")
            cells[2] = f" {cells[2].strip()} ({where}) "
            lines.append("|".join(cells))
        for r in slot.results:
            if r["note"]:
                lines.append(f"| {r['group']} | {device} ({where}) | {r['rc']} | {r['note']} | | | |")
    return "\n".join(lines) + "\n"


def pack(tarball: str, outs: dict[str, str]) -> None:
    """Every slot's logs in one tarball, each log whole or, where the whole would not fit, its last MiB."""
    for tail in (False, True):
        with tarfile.open(tarball, "w:gz") as tar:
            for key, out in outs.items():
                for folder, _, files in os.walk(out):
                    for name in sorted(files):
                        path = os.path.join(folder, name)
                        arc = os.path.join(f"slot_{key}", os.path.relpath(path, out))
                        if tail and os.path.getsize(path) > TAIL_BYTES:
                            with open(path, "rb") as f:
                                f.seek(-TAIL_BYTES, os.SEEK_END)
                                data = f.read()
                            info = tarfile.TarInfo(arc + ".tail")
                            info.size = len(data)
                            tar.addfile(info, io.BytesIO(data))
                        else:
                            tar.add(path, arc)
        if os.path.getsize(tarball) <= TARBALL_LIMIT:
            return


def summary(slot: Slot) -> str:
    """`SLOT 2,3: dp2 ok 412 s; tp FAILED (rows rc 1, 0) 120 s; ...`"""
    parts = []
    for r in slot.results:
        verdict = "ok" if passed(r) else f"FAILED (rows rc {', '.join(r['row_rcs']) or '-'})"
        parts.append(f"{r['group']} {verdict} {r['s']} s" + (f" ({r['note']})" if r["note"] else ""))
    return f"SLOT {slot.label}: " + "; ".join(parts)


def estimated_refusals(slots: list[Slot], host: slot_estimate.Host, total: float) -> list[str]:
    """Each slot's estimate printed; the lines of those that would not finish."""
    row_timeout = float(os.environ.get("ROW_TIMEOUT", slot_estimate.ROW_TIMEOUT_S))
    estimates = [slot_estimate.estimate(s, host, row_timeout) for s in slots]
    print(slot_estimate.report(estimates, total - END_RESERVE_S), flush=True)
    return slot_estimate.refusals(estimates, total, END_RESERVE_S, row_timeout)


def check(argv: list[str], total: float, root: str) -> int:
    """`--estimate [--fresh | --warm] SLOT...`: the refusals and estimates, nothing started."""
    flags = [a for a in argv if a in ("--fresh", "--warm")]
    slots = [parse_slot(spec) for spec in argv if spec not in flags]
    problems = refusals(slots) or ([] if slots else ["no slot given"])
    if not problems:
        host = slot_estimate.read_host(root)
        if "--fresh" in flags:
            host = slot_estimate.Host()
        elif "--warm" in flags:
            host = slot_estimate.warm_host(slots)
        problems = estimated_refusals(slots, host, total)
    print("refused:\n  " + "\n  ".join(problems) if problems else "accepted")
    return 2 if problems else 0


def main(argv: list[str]) -> int:
    start = time.time()
    total = float(os.environ.get("SLOTS_SECONDS", "580"))  # the call's limit is 600 s
    root = os.path.realpath(os.environ.get("SLOTS_ROOT", "/tmp/dagrl_slots"))
    if argv[:1] == ["--estimate"]:
        return check(argv[1:], total, root)
    out, slots = argv[0], [parse_slot(spec) for spec in argv[1:]]
    problems = refusals(slots) or ([] if slots else ["no slot given"])
    if not problems:
        problems = estimated_refusals(slots, slot_estimate.read_host(root), total)
        if problems and os.environ.get("SLOTS_OVER") == "1":
            print("SLOTS_OVER=1: run anyway, past the estimate:\n  " + "\n  ".join(problems), flush=True)
            problems = []
    if problems:
        print("refused (nothing started):\n  " + "\n  ".join(problems))
        return 2
    os.makedirs(out, exist_ok=True)
    for slot in slots:
        prepare(slot, root, skip=[os.path.realpath(out), root])
    deadline = start + total - END_RESERVE_S
    threads = [threading.Thread(target=run_slot, args=(s, deadline)) for s in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = merged_rows(slots, device_name())
    with open(os.path.join(out, "rows.md"), "w") as f:
        f.write(rows)
    pack(os.path.join(out, "logs.tgz"), {s.key: s.dirs["out"] for s in slots})
    print(rows, end="")
    for slot in slots:
        print(summary(slot))
    print(f"slots done in {time.time() - start:.0f} s")
    return 0 if all(passed(r) for s in slots for r in s.results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
