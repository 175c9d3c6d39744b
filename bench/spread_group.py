"""The `spread` group of bench/acceptance_gpu.sh: bench/generate_spread.py's settings, each in a
process of its own, at 32x8x256 (7 reps), then `ours` and the best of the others at 64x8x512 (4
reps) while the budget lasts; every SPREAD line in OUT/spread.out, one docs/gpu_acceptance.md row.

    python bench/spread_group.py OUT --model M --data D --deadline EPOCH [--rows ROWS.md --device NAME]

SPREAD_SETTINGS="ours mp noprefix" runs other settings at the first shape (generate_spread.SETTINGS).
The deadline is the group's budget (SPREAD_SECONDS in acceptance_gpu.sh); ACCEPTANCE_DEADLINE, set
beside other slots, comes first where it is earlier. A run starts only with time for its engine
and two reps; one the deadline cuts keeps the reps it printed (SPREAD_REP lines) and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import generate_spread as gs

GENERATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "generate_spread.py")
COLD_COMPILE_S = 120  # a run's time limit beyond its estimate: the first engine on a fresh machine compiles
ROW_RESERVE_S = 10  # before the slot's deadline: the row


def deadline_of(group_deadline: float) -> float:
    slot = os.environ.get("ACCEPTANCE_DEADLINE")
    return min(group_deadline, float(slot) - ROW_RESERVE_S) if slot else group_deadline


def end_session(pid: int) -> None:
    """TERM, then KILL, to what is left of a run's session (a cut run, an engine-core process)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(3)


def run_process(cmd: list[str], timeout_s: float, log: str) -> int:
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = 124
        end_session(proc.pid)
        proc.wait()
    return rc


def wait_card_free(limit_s: float = 30) -> None:
    """Until the card holds under 1 GiB (a process that ended gives it back a moment later)."""
    end = time.time() + limit_s
    while time.time() < end:
        used = gs.smi("-i", str(gs.visible_gpu()), "--query-gpu=memory.used", "--format=csv,noheader,nounits")
        if not used or float(used.splitlines()[0]) < 1024:
            return
        time.sleep(1)


def record_of(name: str, shape: gs.Shape, text: str, rc: int) -> dict:
    """The run's SPREAD record: its own line, or one made of the reps it printed before the cut."""
    lines = text.splitlines()
    final = [json.loads(line[7:]) for line in lines if line.startswith("SPREAD {")]
    if final:  # whole: what the process's exit did after it (vLLM's teardown) is noted, not a failure
        return {**final[-1], "rc": 0, **({"exit_rc": rc} if rc else {})}
    reps = [json.loads(line[11:]) for line in lines if line.startswith("SPREAD_REP {")]
    if reps:
        return gs.summarize(name, shape, reps, rc=rc, cut=f"after {len(reps)} of {shape.reps} reps")
    errors = [line for line in lines if "Error" in line or "error" in line]
    return {"setting": name, "shape": shape.fields, "rc": rc, "failed": (errors or ["no output"])[-1][:300]}


def best_setting(records: list[dict]) -> str | None:
    """The first shape's lever with the lowest slowest rep (ties: the lower median): a lever that
    removes the slow mode lowers it, one that cuts the CPU's work lowers every rep."""
    done = [
        r
        for r in records
        if r.get("shape") == gs.FIRST_SHAPE.fields and r["setting"] != "ours" and r.get("rep_s")
    ]
    return min(done, key=lambda r: (r["max_s"], r["median_s"]))["setting"] if done else None


def run_group(out: str, args, settings, clock=time.time, run=run_process) -> list[dict]:
    deadline, records = deadline_of(args.deadline), []
    for name, shape in gs.group_plan(settings):
        if name == "best":
            name = best_setting(records)
            if name is None:
                records.append({"setting": "best", "shape": shape.fields, "not_run": "no lever finished"})
                continue
        left, need = deadline - clock(), gs.START_S + 2 * gs.rep_s(shape)  # the engine, a warm-up and a rep
        if left < need:
            records.append(
                {"setting": name, "shape": shape.fields, "not_run": f"{left:.0f} s left, needs ~{need:.0f}"}
            )
            print(f"== {name} {shape.label} not started: {left:.0f} s left", flush=True)
            continue
        log = os.path.join(out, f"{name}_{shape.label}.log")
        cmd = [sys.executable, GENERATE, name, "--model", args.model, "--data", args.data, "--prompts",
               str(shape.prompts), "--n", str(shape.n), "--len", str(shape.len), "--reps", str(shape.reps)]  # fmt: skip
        start = clock()
        rc = run(cmd, min(left, gs.estimate_s(shape) + COLD_COMPILE_S), log)
        record = record_of(name, shape, open(log).read() if os.path.isfile(log) else "", rc)
        records.append(record)
        print(f"== {name} {shape.label} rc={rc} {clock() - start:.0f}s", flush=True)
        print("SPREAD " + json.dumps(record), flush=True)
        wait_card_free()
    return records


def describe(record: dict) -> str:
    name = record["setting"]
    cpus = record.get("numa", {}).get("pinned") or record.get("numa", {}).get("gpu_local")
    name += f" [{cpus}]" if cpus else ""
    if "skipped" in record:
        return f"{name} skipped ({record['skipped']})"
    if "not_run" in record:
        return f"{name} not run ({record['not_run']})"
    if not record.get("rep_s"):
        return f"{name} failed (rc {record.get('rc')}: {record.get('failed', 'no timed rep')[:80]})"
    low, high, spread = record["min_s"], record["max_s"], 100 * record["spread"]
    text = f"{name} {record['median_s']:.2f} s ({low:.2f}-{high:.2f}, spread {spread:.0f} %)"
    return text + (f" cut {record['cut']}" if record.get("cut") else "")


def spread_row(device: str, records: list[dict]) -> str:
    """`| spread | device | rc | per shape: each setting's median (min-max, spread) | ours' median | | |`"""
    shapes: dict[str, list[str]] = {}
    for r in records:
        s = r["shape"]
        shapes.setdefault(f"{s['prompts']}x{s['n']}x{s['len']}", []).append(describe(r))
    best = best_setting(records)
    text = "; ".join(f"{label}: " + ", ".join(parts) for label, parts in shapes.items())
    text += f"; best lever {best}" if best else ""
    # a run that ended badly or timed no rep fails the row; one not started for the budget does not
    ran = [r for r in records if "not_run" not in r and "skipped" not in r]
    rc = next((r.get("rc") or 1 for r in ran if r.get("rc") or not r.get("rep_s")), 0)
    ours = next((r for r in records if r["setting"] == "ours" and r.get("median_s")), None)
    return f"| spread | {device} | {rc} | {text} | {ours['median_s'] if ours else ''} | | |"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--deadline", type=float, required=True, help="epoch seconds: the group's end")
    p.add_argument("--rows", help="append the row to this file")
    p.add_argument("--device", default="")
    args = p.parse_args(argv)
    settings = tuple(os.environ.get("SPREAD_SETTINGS", " ".join(gs.GROUP_SETTINGS)).split())
    unknown = [s for s in settings if s not in gs.SETTINGS]
    if unknown:
        print(f"SPREAD_SETTINGS: unknown {unknown}; settings: {sorted(gs.SETTINGS)}")
        return 2
    os.makedirs(args.out, exist_ok=True)
    print(gs.plan_text(settings, deadline_of(args.deadline) - time.time()), flush=True)
    records = run_group(args.out, args, settings)
    with open(os.path.join(args.out, "spread.out"), "w") as f:
        f.writelines("SPREAD " + json.dumps(r) + "\n" for r in records)
    row = spread_row(args.device, records)
    print(row)
    if args.rows:
        with open(args.rows, "a") as f:
            f.write(row + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
