"""The rollout's spread: the same batch generated rep after rep in one process, for one SETTING.

dagrl's vLLM rollout took 2.0-3.4 s for the same 32 x 8 x 256 tokens on an H200 (bimodal, ~2.05 or
~3.1 s) and plain `vllm.LLM.generate` spread the same way on an H100: the decode loop is CPU-bound
and noisy. Each setting changes one lever on that loop's CPU work or on the process around it; one
engine per process, every rep the same work (ignore_eos), the first rep a warm-up reported apart.

    python bench/generate_spread.py SETTING --model M --data D [--prompts 32 --n 8 --len 256 --reps 7]
    python bench/generate_spread.py --dry-run [SETTING]    # the plan, without importing torch or vllm

prints SPREAD_REP {...} after each rep and SPREAD {...} at the end: per-rep seconds of the engine's
generate, median, min, max, (max - min) / median, tokens/s, where each step's time went (vLLM's
scheduler, model runner calls, output processing) and the host (CPU, affinity, threads, GPU).
bench/spread_group.py runs every setting in a process of its own (acceptance_gpu.sh's `spread`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from dagrl.core.affinity import apply_cpu_affinity, compact, gpu_local_cpus, pin_to_gpu, smi, visible_gpu

WORKER_THREADS = 4  # a trainer's GPU worker: Ray's num_cpus (at most 4, dagrl/core/pools.py), torch's threads


@dataclass(frozen=True)
class Setting:
    name: str
    changes: str  # against `ours`
    overrides: tuple[str, ...] = ()  # dagrl config overrides after the base's
    threads: int | None = None  # torch's and OpenMP's threads; None: the worker's
    pin_gpu_local: bool = False  # the process on the CPUs local to the GPU, before anything starts
    plain_mp: bool = False  # plain vllm.LLM, its engine core in a process of its own


R = "actor_rollout_ref.rollout"
SETTINGS = {
    s.name: s
    for s in (
        Setting("ours", "dagrl's backend as a rollout worker runs it: in-process engine (external_launcher),"
                " async scheduling, no log-probs (GRPO's step reads none), prefix caching, 4 torch threads"),
        # vLLM returns a log-prob per sampled token each step: a GPU->CPU copy, a slice per request in
        # the scheduler's update and an append per request in the output processor (session 30: 1.44 s
        # without, 2.59 with, for 32x8x256 on an H200; dagrl asks for them where a correction reads them)
        Setting("logprobs", "the sampled tokens' log-probs asked of vLLM (rollout.calculate_log_probs=true)",
                (f"{R}.calculate_log_probs=true",)),
        # vLLM 0.26 turns async scheduling on by itself (config/vllm.py): the next step is scheduled
        # while the GPU runs this one; off, each step waits for its tokens before the next is planned
        Setting("noasync", "async scheduling off (engine_kwargs.vllm.async_scheduling=false)",
                (f"+{R}.engine_kwargs.vllm.async_scheduling=false",)),
        Setting("threads1", "torch.set_num_threads(1), OMP_NUM_THREADS=1 before torch loads", threads=1),
        Setting("numa", "the process pinned to the GPU's local CPUs (sysfs local_cpulist or nvidia-smi"
                " topo -m) before anything starts", pin_gpu_local=True),
        # not in the group by default: dagrl's own option against `numa` (the bench pinning the
        # process before torch loads); the worker pins every thread it has once torch is loaded
        Setting("numa_worker", "dagrl pins the worker to the GPU's local CPUs as a GPU worker starts"
                " (trainer.cpu_affinity=gpu_local)", ("trainer.cpu_affinity=gpu_local",)),
        Setting("mp", "plain vllm.LLM, the engine core in a process of its own"
                " (VLLM_ENABLE_V1_MULTIPROCESSING=1, no external_launcher), same requests", plain_mp=True),
        # not in the group by default (budget): each request hashes every block it fills (pickle +
        # sha256, vllm/config/cache.py) and the cache maps it; off, the n samples prefill their prompt n times
        Setting("noprefix", "prefix caching off (rollout.enable_prefix_caching=false)",
                (f"{R}.enable_prefix_caching=false",)),
    )
}  # fmt: skip
# the engine as the trainer keeps it on an H200 at these shapes: awake (the plan's auto), bf16
BASE_OVERRIDES = (f"{R}.free_cache_engine=false",)
# in order of what they may show: the engine core out of the process, its per-step work, the host
GROUP_SETTINGS = ("ours", "mp", "noasync", "logprobs", "numa", "threads1")


@dataclass(frozen=True)
class Shape:
    prompts: int
    n: int
    len: int
    reps: int  # the first is the warm-up

    @property
    def label(self) -> str:
        return f"{self.prompts}x{self.n}x{self.len}"

    @property
    def fields(self) -> dict:
        """The work of a rep, as SPREAD records name it."""
        return {"prompts": self.prompts, "n": self.n, "len": self.len}


FIRST_SHAPE, SECOND_SHAPE = Shape(32, 8, 256, 7), Shape(64, 8, 512, 4)
START_S, END_S = 45.0, 5.0  # a process: imports and the engine's start (warm compile cache); its exit
REP_S_256 = 2.5  # a 32x8x256 rep on an H200; others scale with the tokens


def rep_s(shape: Shape) -> float:
    return REP_S_256 * (shape.prompts * shape.n / 256) * (shape.len / 256)


def estimate_s(shape: Shape) -> float:
    return START_S + shape.reps * rep_s(shape) + END_S


def group_plan(settings=GROUP_SETTINGS) -> list[tuple[str, Shape]]:
    """The group's runs in order; "best" is the first shape's best setting, chosen when known."""
    return [(s, FIRST_SHAPE) for s in settings] + [("ours", SECOND_SHAPE), ("best", SECOND_SHAPE)]


def plan_text(settings=GROUP_SETTINGS, budget_s: float | None = None) -> str:
    lines, total = [], 0.0
    for name, shape in group_plan(settings):
        est = estimate_s(shape)
        total += est
        what = (
            "the lowest slowest rep of the first shape's settings"
            if name == "best"
            else SETTINGS[name].changes
        )
        when = "  (if time allows)" if shape == SECOND_SHAPE else ""
        lines.append(f"{name:<11} {shape.label} reps {shape.reps} (1 warm-up)  ~{est:.0f} s{when}: {what}")
    first = sum(estimate_s(FIRST_SHAPE) for _ in settings)
    lines.append(f"estimate: {first:.0f} s for {FIRST_SHAPE.label}, {total:.0f} s with {SECOND_SHAPE.label}"
                 + (f"; budget {budget_s:.0f} s" if budget_s else ""))  # fmt: skip
    return "\n".join(lines)


# ---- the host -------------------------------------------------------------------------------------
# the GPU's CPUs are read and pinned by dagrl's own helpers (dagrl/core/affinity.py), as
# trainer.cpu_affinity=gpu_local does in a worker


def host_facts() -> dict:
    import torch

    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""
    )
    governor = "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
    gpu = visible_gpu()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "affinity": compact(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
        "gpu": smi("-i", str(gpu), "--query-gpu=name,pci.bus_id", "--format=csv,noheader"),
        "governor": open(governor).read().strip() if os.path.isfile(governor) else None,
        "loadavg": open("/proc/loadavg").read().split()[:3],
    }


def prepare_process(setting: Setting) -> dict:
    """What the setting changes before torch loads (threads inherit the affinity, OpenMP reads
    its variable once); the facts to report, with "skipped" where the setting would change nothing."""
    facts: dict = {}
    if setting.pin_gpu_local:
        pin = pin_to_gpu(gpu_local_cpus())  # the card as nvidia-smi names it: no CUDA yet
        facts["numa"] = pin.facts()
        if pin.unchanged:
            facts["skipped"] = pin.unchanged  # the run would be `ours` again
            return facts
    threads = setting.threads or min(WORKER_THREADS, len(os.sched_getaffinity(0)))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    # as a worker sets before its first CUDA allocation (dagrl/core/worker.py expandable_segments)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    if setting.plain_mp:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    import torch

    torch.set_num_threads(threads)
    return facts


# ---- the measurement ------------------------------------------------------------------------------
class StepTimers:
    """Where each engine step's time goes, summed per rep: bound methods of vLLM's live objects
    wrapped (their callers look them up on the object at each call, so the wrappers run). Parts a
    process lacks (with `mp` the scheduler and the model runner live in the engine-core process)
    are left out. `core` holds schedule, update, execute and sample, and the wait for the GPU."""

    PARTS = {
        "core": ("engine_core", "get_output"),
        "outputs": ("output_processor", "process_outputs"),
        "schedule": ("engine_core.engine_core.scheduler", "schedule"),
        "update": ("engine_core.engine_core.scheduler", "update_from_output"),
        "execute": ("engine_core.engine_core.model_executor", "execute_model"),
        "sample": ("engine_core.engine_core.model_executor", "sample_tokens"),
    }

    def __init__(self, engine):
        self.sums: dict[str, float] = {}
        self.steps: list[float] = []
        self._wrap(engine, "step", self.steps.append)
        for part, (path, method) in self.PARTS.items():
            obj = engine
            for attr in path.split("."):
                obj = getattr(obj, attr, None)
            if obj is not None and hasattr(obj, method):
                self._wrap(
                    obj, method, lambda s, part=part: self.sums.__setitem__(part, self.sums.get(part, 0) + s)
                )

    @staticmethod
    def _wrap(obj, method: str, record) -> None:
        inner = getattr(obj, method)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                record(time.perf_counter() - start)

        setattr(obj, method, timed)

    def take(self) -> dict:
        """This rep's figures; the counts start again."""
        ms = sorted(1e3 * s for s in self.steps)
        parts = {k: round(v, 3) for k, v in self.sums.items()}
        self.steps.clear()
        self.sums.clear()
        if not ms:
            return {"steps": 0, "parts_s": parts}
        pick = {"median": statistics.median(ms), "p90": ms[int(0.9 * (len(ms) - 1))], "max": ms[-1]}
        return {"steps": len(ms), "step_ms": {k: round(v, 2) for k, v in pick.items()}, "parts_s": parts}


def cpu_mhz(cpu: int) -> float | None:
    path = f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq"
    if os.path.isfile(path):
        return int(open(path).read()) / 1e3
    current = None
    for line in open("/proc/cpuinfo"):
        key, _, value = line.partition(":")
        if key.strip() == "processor":
            current = int(value)
        elif key.strip() == "cpu MHz" and current == cpu:
            return float(value)
    return None


def thread_sample() -> dict:
    """The calling thread's CPU and that CPU's clock now; the process's CPU seconds and involuntary
    context switches; the thread's migrations where the kernel counts them (/proc/thread-self/sched)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(open("/proc/thread-self/stat").read().rsplit(")", 1)[1].split()[36])  # field 39, processor
    out = {
        "cpu": cpu,
        "mhz": cpu_mhz(cpu),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "nivcsw": usage.ru_nivcsw,
    }
    if os.path.isfile("/proc/thread-self/sched"):
        for line in open("/proc/thread-self/sched"):
            key, _, value = line.partition(":")
            if key.strip() == "se.nr_migrations":
                out["migrations"] = int(float(value))
    return out


def time_reps(engine, generate, reset, reps: int) -> list[dict]:
    """Each rep: reset() untimed (a trainer step's boundary), then generate(seed) -> (the engine's
    seconds, tokens); one SPREAD_REP line each, so a run the deadline cuts keeps what it did."""
    timers, records = StepTimers(engine), []
    for rep in range(reps):
        reset()
        before, start = thread_sample(), time.perf_counter()
        seconds, tokens = generate(rep)
        wall, after = time.perf_counter() - start, thread_sample()
        host = {"cpu": after["cpu"], "mhz": after["mhz"], "cpu_s": round(after["cpu_s"] - before["cpu_s"], 3),
                "nivcsw": after["nivcsw"] - before["nivcsw"]}  # fmt: skip
        if "migrations" in after:
            host["migrations"] = after["migrations"] - before["migrations"]
        record = {"rep": rep, "s": round(seconds, 3), "wall_s": round(wall, 3), "tokens": tokens}
        record.update(timers.take(), host=host)
        print("SPREAD_REP " + json.dumps(record), flush=True)
        records.append(record)
    return records


def measure_backend(setting: Setting, args, shape: Shape) -> tuple[list[dict], dict, Callable]:
    """dagrl's VLLMRolloutBackend.generate on the collated batch (bench/rollout_vs_vllm.py's)."""
    import rollout_vs_vllm as rv
    import torch

    from dagrl.core.worker import freeze_heap

    cfg = rv.rollout_config(args, *BASE_OVERRIDES, *setting.overrides)
    # what a GPU worker does at its start (dagrl/core/worker.py), before its roles build
    pin = apply_cpu_affinity(cfg.trainer.cpu_affinity, "cuda")
    start = time.perf_counter()
    backend = rv.backend_of(cfg)
    engine_s = time.perf_counter() - start
    batch, _ = rv.batch_of(cfg, args)
    freeze_heap()  # as a worker does once its roles are built

    def generate(seed: int) -> tuple[float, int]:
        out, metrics = backend.generate(batch, seed=seed)
        torch.cuda.synchronize()
        return metrics["rollout/generate_s"], int(out["response_mask"].sum())

    # the prefix cache reset an awake engine gets after each sync (finish_weight_update)
    reps = time_reps(backend.llm.llm_engine, generate, backend.finish_weight_update, shape.reps)

    def close() -> None:
        backend.shutdown()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    extra = {"engine_start_s": round(engine_s, 1)} | ({"numa": pin.facts()} if pin else {})
    return reps, extra, close


def measure_plain(setting: Setting, args, shape: Shape) -> tuple[list[dict], dict, Callable]:
    """Plain vllm.LLM on dagrl's engine arguments but external_launcher (vLLM picks its own executor
    in the engine-core process), the backend's requests: a prompt's n samples one request, its seeds."""
    import rollout_vs_vllm as rv
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from dagrl.backends.hf_model import resolve_model_path
    from dagrl.backends.vllm.engine_args import llm_kwargs, sampling_kwargs
    from dagrl.backends.vllm.rollout import request_seed_base
    from dagrl.config.role_specs import role_spec
    from dagrl.core.worker import freeze_heap

    cfg = rv.rollout_config(args, *BASE_OVERRIDES, *setting.overrides)
    spec = role_spec(cfg, "rollout")
    kwargs = llm_kwargs(spec, resolve_model_path(spec.model.path))
    del kwargs["distributed_executor_backend"]
    start = time.perf_counter()
    llm = LLM(**kwargs)
    engine_s = time.perf_counter() - start
    _, prompt_ids = rv.batch_of(cfg, args)
    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in ids]) for ids in prompt_ids]
    sampling = {**sampling_kwargs(spec, [], validate=False), "n": args.n}  # ignore_eos: no stop ids
    freeze_heap()

    def generate(seed: int) -> tuple[float, int]:
        base = request_seed_base(seed, 0)
        params = [SamplingParams(seed=base + r * args.n, **sampling) for r in range(len(prompts))]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start, sum(len(c.token_ids) for o in outputs for c in o.outputs)

    reps = time_reps(llm.llm_engine, generate, llm.reset_prefix_cache, shape.reps)
    return reps, {"engine_start_s": round(engine_s, 1)}, llm.llm_engine.engine_core.shutdown


def summarize(setting: str, shape: Shape, reps: list[dict], **extra) -> dict:
    """The SPREAD record of a run's reps (rep 0 the warm-up)."""
    timed = [r["s"] for r in reps[1:]]
    out = {"setting": setting, "shape": shape.fields}
    out["warmup_s"] = reps[0]["s"] if reps else None
    out["rep_s"] = timed
    if timed:
        median = statistics.median(timed)
        out.update(median_s=round(median, 3), min_s=min(timed), max_s=max(timed),
                   spread=round((max(timed) - min(timed)) / median, 3),
                   tokens_per_s=round(reps[-1]["tokens"] / median))  # fmt: skip
    return {**out, **extra, "reps": reps}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("setting", nargs="?", choices=sorted(SETTINGS))
    p.add_argument("--dry-run", action="store_true", help="print the plan; import neither torch nor vllm")
    p.add_argument("--model")
    p.add_argument("--data")
    p.add_argument("--prompts", type=int, default=FIRST_SHAPE.prompts)
    p.add_argument("--n", type=int, default=FIRST_SHAPE.n)
    p.add_argument("--len", type=int, default=FIRST_SHAPE.len)
    p.add_argument("--reps", type=int, default=FIRST_SHAPE.reps)
    # 64x8x512 holds ~270k tokens of KV cache (30 GiB) with prompts shared: room on an H100 too
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    args = p.parse_args(argv)
    shape = Shape(args.prompts, args.n, args.len, args.reps)
    if args.dry_run:
        if args.setting is None:
            print(plan_text())
        else:
            s = SETTINGS[args.setting]
            print(f"{s.name} {shape.label} reps {shape.reps} (1 warm-up): {s.changes}")
            pinned = ("by the bench, before torch" if s.pin_gpu_local else "by dagrl, as a worker starts"
                      if "trainer.cpu_affinity=gpu_local" in s.overrides else "no")  # fmt: skip
            print(f"  overrides: {' '.join(BASE_OVERRIDES + s.overrides)}; threads: {s.threads or WORKER_THREADS};"
                  f" pinned: {pinned}; engine: {'plain, own process' if s.plain_mp else 'dagrl, in-process'}")  # fmt: skip
        return 0
    if args.setting is None or not args.model or not args.data:
        p.error("give SETTING, --model and --data (or --dry-run)")
    setting = SETTINGS[args.setting]
    facts = prepare_process(setting)  # first: before torch or vllm load
    if "skipped" in facts:
        print("SPREAD " + json.dumps({"setting": setting.name, "shape": shape.fields, **facts}), flush=True)
        return 0
    args.sleep_level = 1  # rollout_vs_vllm.rollout_config's; the engine stays awake here
    start = time.perf_counter()
    measure = measure_plain if setting.plain_mp else measure_backend
    reps, extra, close = measure(setting, args, shape)
    extra["process_s"] = round(time.perf_counter() - start, 1)
    record = summarize(setting.name, shape, reps, host=host_facts(), **facts, **extra)
    print("SPREAD " + json.dumps(record), flush=True)  # before the engine's teardown, which may fail
    close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
