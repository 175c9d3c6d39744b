"""bench/generate_spread.py and bench/spread_group.py (acceptance_gpu.sh's `spread`): the plan
without torch or vLLM, the `numa` settings on dagrl's own affinity helpers, and the group's runs
under its budget, best lever and row, with the processes faked."""

from __future__ import annotations

import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
import generate_spread as gs  # noqa: E402  (conftest puts bench/ on the path)
import spread_group  # noqa: E402


def test_the_numa_setting_pins_with_dagrls_helpers_and_skips_where_nothing_would_change(monkeypatch):
    """One implementation (dagrl/core/affinity.py, tests/core/test_affinity.py): here the bench's
    process as it starts, on a card whose CPUs are all this process's already."""
    from dagrl.core import affinity

    allowed = os.sched_getaffinity(0)
    monkeypatch.setattr(
        gs, "gpu_local_cpus", lambda: affinity.GpuCpus(frozenset(allowed), "0000:19:00.0", "t")
    )
    facts = gs.prepare_process(gs.SETTINGS["numa"])
    assert facts["skipped"] == "the affinity is the GPU's already" and os.sched_getaffinity(0) == allowed
    assert facts["numa"]["pinned"] == gs.compact(allowed) and facts["numa"]["gpu"] == "0000:19:00.0"
    monkeypatch.setattr(
        gs, "gpu_local_cpus", lambda: affinity.GpuCpus(frozenset(), "GPU0", "nothing read: x")
    )
    assert gs.prepare_process(gs.SETTINGS["numa"])["skipped"] == "the GPU's local CPUs could not be read"


def dry_run(*args: str) -> str:
    """generate_spread's --dry-run in a fresh interpreter, with what it imported."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import generate_spread as g;"
        "g.main(sys.argv[2:]); print('IMPORTED', sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, BENCH, "--dry-run", *args], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_the_dry_run_lists_every_setting_and_shape_without_torch_or_vllm():
    plan = dry_run()
    assert "IMPORTED []" in plan
    lines = plan.splitlines()
    for name in ("ours", "logprobs", "noasync", "threads1", "numa", "mp"):
        assert any(line.split()[:2] == [name, "32x8x256"] and "reps 7" in line for line in lines), name
    assert any(line.split()[:2] == ["ours", "64x8x512"] and "reps 4" in line for line in lines)
    assert any(line.split()[:2] == ["best", "64x8x512"] for line in lines)
    assert "estimate: 405 s for 32x8x256" in plan
    one = dry_run("noasync")
    assert "engine_kwargs.vllm.async_scheduling=false" in one and "IMPORTED []" in one
    assert "plain, own process" in dry_run("mp", "--prompts", "64", "--len", "512")


def rep(i: int, s: float) -> str:
    return "SPREAD_REP " + json.dumps({"rep": i, "s": s, "tokens": 65536})


WORK = ("--prompts", "--n", "--len", "--reps")


def fake_runs(out_texts: dict, clock: list[float], seconds: float):
    """A run: its log from out_texts[(setting, len)] (rc, text); the clock moves `seconds`."""

    def run(cmd, timeout_s, log):
        setting, (prompts, n, length, reps) = cmd[2], (int(cmd[cmd.index(k) + 1]) for k in WORK)
        rc, text = out_texts.get((setting, length), (0, ""))
        if not text:
            shape = gs.Shape(prompts, n, length, reps)
            reps = [{"rep": i, "s": 3.0 if i == 0 else 2.0 + 0.1 * i, "tokens": 65536} for i in range(reps)]
            text = "SPREAD " + json.dumps(gs.summarize(setting, shape, reps))
        open(log, "w").write(text)
        clock[0] += min(seconds, timeout_s)
        return rc

    return run


class Args:
    model, data = "/m", "/d"

    def __init__(self, deadline: float):
        self.deadline = deadline


def test_the_group_runs_what_its_budget_holds_and_writes_one_row(tmp_path, monkeypatch):
    monkeypatch.delenv("ACCEPTANCE_DEADLINE", raising=False)
    clock = [1000.0]
    cut = "\n".join(rep(i, s) for i, s in enumerate([3.0, 2.0, 3.1]))
    pin = {"gpu_local": "0-47", "pinned": "0-15"}
    numa = "SPREAD " + json.dumps(
        {"setting": "numa", "shape": gs.FIRST_SHAPE.fields, "numa": pin, "skipped": "as is"}
    )
    texts = {("noasync", 256): (0, ""), ("threads1", 256): (124, cut), ("numa", 256): (0, numa)}
    # noasync's slowest rep is the lowest: 2.0 + 0.1 * i, shifted down
    texts[("noasync", 256)] = (0, "SPREAD " + json.dumps(gs.summarize("noasync", gs.FIRST_SHAPE, [
        {"rep": i, "s": 1.9 + 0.01 * i, "tokens": 65536} for i in range(7)])))  # fmt: skip
    run = fake_runs(texts, clock, 60)
    # six runs of 60 s, then 65 s left: ours at 64x8x512 starts (45 + 2 reps of 10 s), the best does not
    records = spread_group.run_group(
        str(tmp_path), Args(1000 + 6 * 60 + 65), gs.GROUP_SETTINGS, lambda: clock[0], run
    )
    assert [r["setting"] for r in records] == [*gs.GROUP_SETTINGS, "ours", "noasync"]
    assert records[-1]["not_run"] == "5 s left, needs ~65"
    threads1 = next(r for r in records if r["setting"] == "threads1")
    assert threads1["cut"] == "after 3 of 7 reps" and threads1["rep_s"] == [2.0, 3.1]
    row = spread_group.spread_row("NVIDIA H200", records)
    cells = row.split("|")
    assert cells[1].strip() == "spread" and cells[3].strip() == "124"  # the cut run fails the row
    assert "threads1 2.55 s (2.00-3.10, spread 43 %) cut after 3 of 7 reps" in row
    assert "numa [0-15] skipped (as is)" in row and "noasync not run (5 s left, needs ~65)" in row
    assert row.count("32x8x256: ") == 1 and "64x8x512: ours " in row and "best lever noasync" in row
    assert cells[5].strip() == "2.35"  # ours' median at the first shape


def test_a_group_whose_runs_all_finish_passes_and_an_empty_run_fails(tmp_path, monkeypatch):
    monkeypatch.delenv("ACCEPTANCE_DEADLINE", raising=False)
    clock = [0.0]
    records = spread_group.run_group(
        str(tmp_path), Args(1e9), ("ours", "mp"), lambda: clock[0], fake_runs({}, clock, 60)
    )
    assert [r["setting"] for r in records] == ["ours", "mp", "ours", "mp"]
    assert spread_group.spread_row("H200", records).split("|")[3].strip() == "0"
    crashed = {("mp", 256): (1, "Traceback\nRuntimeError: CUDA error: out of memory")}
    records = spread_group.run_group(
        str(tmp_path), Args(1e9), ("ours", "mp"), lambda: clock[0], fake_runs(crashed, clock, 60)
    )
    assert records[1]["failed"] == "RuntimeError: CUDA error: out of memory"
    assert records[3]["not_run"] == "no lever finished"
    row = spread_group.spread_row("H200", records)
    assert row.split("|")[3].strip() == "1" and "mp failed (rc 1: RuntimeError" in row


def test_the_slots_deadline_comes_first(monkeypatch):
    monkeypatch.setenv("ACCEPTANCE_DEADLINE", "1500")
    assert spread_group.deadline_of(2000) == 1490 and spread_group.deadline_of(1200) == 1200


class FakeScheduler:
    def schedule(self):
        return "plan"

    def update_from_output(self, plan, out):
        return {0: out}


class FakeCore:  # vLLM's in-process EngineCore: looks its parts up at each call
    def __init__(self):
        self.scheduler = FakeScheduler()

    def step(self):
        return self.scheduler.update_from_output(self.scheduler.schedule(), "tokens")


class FakeClient:  # InprocClient
    def __init__(self):
        self.engine_core = FakeCore()

    def get_output(self):
        return self.engine_core.step()


class FakeProcessor:
    def process_outputs(self, outputs):
        return outputs


class FakeEngine:  # LLMEngine: step() as LLM._run_engine calls it
    def __init__(self):
        self.engine_core, self.output_processor = FakeClient(), FakeProcessor()

    def step(self):
        return self.output_processor.process_outputs(self.engine_core.get_output())


def test_each_rep_says_where_its_steps_went(capsys):
    engine = FakeEngine()

    def generate(seed):
        for _ in range(10 + seed):
            engine.step()
        return 0.5, 100

    records = gs.time_reps(engine, generate, lambda: None, 3)
    assert [r["steps"] for r in records] == [10, 11, 12]  # counts start again each rep
    assert set(records[0]["parts_s"]) == {"core", "outputs", "schedule", "update"}  # no model executor here
    assert {"cpu", "mhz", "cpu_s", "nivcsw"} <= set(records[0]["host"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("SPREAD_REP {")]
    assert [json.loads(line[11:])["rep"] for line in lines] == [0, 1, 2]
    summary = gs.summarize("ours", gs.Shape(32, 8, 256, 3), records)
    assert summary["warmup_s"] == 0.5 and summary["rep_s"] == [0.5, 0.5] and summary["tokens_per_s"] == 200


def test_each_setting_changes_only_its_lever_in_the_engines_arguments():
    """The overrides compose (a misspelt key would cost a GPU call) and touch nothing else."""
    import rollout_vs_vllm as rv

    from dagrl.backends.vllm.engine_args import llm_kwargs, sampling_kwargs
    from dagrl.config.role_specs import role_spec
    from dagrl.data.builtin import tiny_model_path

    class Args:
        model, data, n, len, gpu_memory_utilization, sleep_level = (
            tiny_model_path(),
            "x.parquet",
            8,
            256,
            0.5,
            1,
        )

    def arguments(name: str) -> dict:
        spec = role_spec(rv.rollout_config(Args, *gs.BASE_OVERRIDES, *gs.SETTINGS[name].overrides), "rollout")
        return {
            **llm_kwargs(spec, "M"),
            **{f"sampling.{k}": v for k, v in sampling_kwargs(spec, [], False).items()},
        }

    pinned = rv.rollout_config(Args, *gs.BASE_OVERRIDES, *gs.SETTINGS["numa_worker"].overrides)
    assert pinned.trainer.cpu_affinity.value == "gpu_local"  # dagrl's own option, as a worker applies it
    assert "numa_worker" not in gs.GROUP_SETTINGS
    ours = arguments("ours")
    assert ours["enable_sleep_mode"] is False and ours["dtype"] == "bfloat16" and ours["sampling.ignore_eos"]
    changed = {}
    for name in gs.SETTINGS:
        other = arguments(name)
        changed[name] = {k: other.get(k) for k in ours.keys() | other.keys() if ours.get(k) != other.get(k)}
    assert changed == {
        "ours": {}, "threads1": {}, "numa": {}, "numa_worker": {}, "mp": {},  # the process's, not the engine's
        "logprobs": {"sampling.logprobs": 0, "sampling.flat_logprobs": True},
        "noasync": {"async_scheduling": False},
        "noprefix": {"enable_prefix_caching": False},
    }  # fmt: skip


def test_a_run_whose_exit_fails_after_its_spread_line_keeps_its_figures():
    reps = [{"rep": i, "s": 2.0, "tokens": 65536} for i in range(7)]
    text = "SPREAD " + json.dumps(gs.summarize("ours", gs.FIRST_SHAPE, reps)) + "\nSegmentation fault"
    record = spread_group.record_of("ours", gs.FIRST_SHAPE, text, -11)
    assert (record["rc"], record["exit_rc"], record["median_s"]) == (0, -11, 2.0)
    assert spread_group.spread_row("H200", [record]).split("|")[3].strip() == "0"
