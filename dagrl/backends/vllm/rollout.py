"""Rollout on vLLM, one engine shard per worker process.

The engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, `external_launcher`): it reuses
the pool's process group, so rollout TP=k takes k consecutive workers and each TP group is an
independent replica fed its own share of the prompts. In-process means new weights reach the
engine without leaving the GPU: `load_weights` on vLLM's own module, fed the trainer's tensors.

Colocated with a trainer, the engine sleeps while the trainer works (`free_cache_engine`), and a
weight refresh wakes it in stages so old weights, new weights and the KV cache never sit on the
GPU together (see `begin_weight_update` / `finish_weight_update`). Free GPU memory after each
phase is reported as `memory/rollout_*_free_gib`.

A prompt's n samples (collate's runs of n rows, which the worker hands over marked:
`Batch.repeats`) are one request with `SamplingParams(n=...)`; vLLM fans it out into n sequences
seeded seed + i, which are the seeds one request per row had, and returns them by sample index
(`convert.completions_in_row_order` puts them back on their rows).

A LoRA policy synced as adapters (rollout.lora_sync adapter, auto's choice here) keeps the base
the engine loaded and takes only the adapter tensors each sync: they are handed to vLLM's LoRA
manager in memory (`lora_adapter.py`, no file written) and every request names the adapter.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch

from dagrl.backends import device_memory
from dagrl.backends.hf_model import eos_token_ids, load_generation_config, load_tokenizer, resolve_model_path
from dagrl.backends.vllm.convert import completions_in_row_order, prompt_token_lists, responses_to_tensors
from dagrl.backends.vllm.engine import start_engine
from dagrl.backends.vllm.engine_args import llm_kwargs, sampling_kwargs
from dagrl.backends.vllm.lora_adapter import PolicyAdapter
from dagrl.backends.vllm.multi_turn import VLLMStepSampler
from dagrl.config.roles import RoleSpec
from dagrl.config.schema import LoraSync
from dagrl.core.batch import Batch
from dagrl.rollout.multi_turn import MultiTurnRollout, batch_rows


def request_seed_base(step_seed: int, replica: int) -> int:
    """Seed of request 0 of a replica's shard; request i uses base + i (int64-safe for shards
    under 65,536 rows and 64 replicas)."""
    return ((step_seed % 2**31) * 64 + replica % 64) << 16


def samples_per_request(batch: Batch, temperature: float) -> int:
    """How many rows one engine request samples: a prompt's n rows when the batch marks its prompts
    as runs of n (collate's n samples per prompt, `Batch.repeats`) and sampling is not greedy; 1
    otherwise (validation, greedy, a shard whose runs were cut)."""
    n = batch.repeats.get("prompts", 1)
    return n if n > 1 and batch.repeats.get("prompt_mask") == n and temperature > 0 else 1


def _free_gib() -> float:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0] / 2**30


class VLLMRolloutBackend:
    def __init__(self, spec: RoleSpec, ctx):
        """One engine shard of the spec's model, set up from the spec's `rollout` section
        (engine_args.py); a TP group of `spec.parallel.tp` workers is one replica."""
        assert ctx.device.type == "cuda", "validate refuses rollout.name=vllm off the GPU"
        assert spec.rollout is not None, f"role {spec.name!r}: a rollout spec carries its rollout section"
        self.spec, self.ctx, self.settings = spec, ctx, spec.rollout
        self.tp = spec.parallel.tp
        path = resolve_model_path(spec.model.path)
        trust = spec.model.trust_remote_code
        tok = load_tokenizer(path, trust)
        self.pad_id = tok.pad_token_id
        self.eos_ids = eos_token_ids(tok, load_generation_config(path, trust))
        self.llm, self.model, self.start_s = start_engine(
            llm_kwargs(spec, path), ctx.rank, ctx.world_size, spec.card_gib
        )
        mt = self.settings.multi_turn
        self.multi_turn = (
            MultiTurnRollout(mt, tok, spec.lengths.response, self.eos_ids, self.pad_id) if mt.enable else None
        )
        self.asleep = False
        self.synced = False  # weights loaded by a sync since the start (level 2 may drop them then)
        self.memory: dict[str, float] = {}  # phase -> free GiB, reported by the next generate
        lora = spec.lora
        self.adapter = (
            PolicyAdapter(self.llm, lora) if lora is not None and lora.sync == LoraSync.adapter else None
        )

    # ---- placement -----------------------------------------------------------------------------
    def dp_info(self) -> tuple[int, int, bool]:
        """A TP group is one replica: its ranks get the same shard, its first rank returns it."""
        return self.ctx.rank // self.tp, self.ctx.world_size // self.tp, self.ctx.rank % self.tp == 0

    def offload(self) -> bool:
        """Hand the GPU to a colocated role: free the KV cache and the weights (sleep_level)."""
        # None: no memory plan resolved auto (a backend built from a bare spec), and the engine
        # was started with sleep mode (engine_args.llm_kwargs), as before auto existed
        if self.settings.free_cache_engine is False:
            return False
        if not self.asleep:
            # level 2 drops the weights for the next sync to refill; before the first sync (the
            # engine sleeps right after it starts, and validation before training samples without
            # a sync) only level 1 keeps them
            level = self.settings.sleep_level if self.synced else 1
            self.llm.sleep(level=level)
            self.asleep = True
            self.memory["memory/rollout_asleep_free_gib"] = _free_gib()
        return True

    def onload(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    # ---- weights -------------------------------------------------------------------------------
    def begin_weight_update(self) -> None:
        """Stage 1: the weights' memory only (the KV cache stays freed)."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
            self.memory["memory/rollout_weights_awake_free_gib"] = _free_gib()

    def engine_params(self) -> dict[str, torch.Tensor] | None:
        """vLLM's parameters, for a direct refresh (weight_layout.py); None with rollout TP > 1,
        where a rank holds column slices that no row map describes, and with an adapter sync
        (the adapter tensors are no parameters of the engine's module)."""
        if self.adapter is not None:
            return None
        return dict(self.model.named_parameters()) if self.tp == 1 else None

    def load_weights(self, buckets: Iterable[dict[str, torch.Tensor]]) -> int:
        """Stage 2: HF-named tensors (on the GPU when colocated) into vLLM's module; vLLM's loaders
        fuse q/k/v and gate/up and take each TP rank's slice."""
        nbytes = 0
        for bucket in buckets:
            if self.adapter is not None:  # the adapter, one bucket (TorchTrainBackend.export_weights)
                self.adapter.install(bucket)
            else:
                self.model.load_weights(bucket.items())
            nbytes += sum(t.numel() * t.element_size() for t in bucket.values())
        self.synced = True
        return nbytes

    def finish_weight_update(self) -> None:
        """Stage 3, after the trainer has left the GPU: the KV cache; cached prefixes are stale."""
        if self.asleep:
            self.memory["memory/rollout_before_kv_free_gib"] = _free_gib()
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        else:
            self.llm.reset_prefix_cache()
        self.memory["memory/rollout_awake_free_gib"] = _free_gib()

    # ---- generation ----------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, batch: Batch, seed: int, validate: bool = False) -> tuple[Batch, dict]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.onload()  # generating while (partly) asleep would wait forever
        kwargs = sampling_kwargs(self.spec, self.eos_ids, validate)
        if self.multi_turn is not None:
            return self._episodes(batch, kwargs, request_seed_base(seed, self.ctx.rank // self.tp))
        # a prompt's n samples (collate's runs of n rows) are one request of n: the prompt is sent
        # and checked once, the engine fans it out into n sequences; validation keeps a request
        # per row, and so does greedy sampling (vLLM refuses greedy with n > 1)
        n = 1 if validate else samples_per_request(batch, kwargs["temperature"])
        token_lists = prompt_token_lists(batch["prompts"][::n], batch["prompt_mask"][::n])
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in token_lists]
        # one seed per row: vLLM samples by (seed, position), so a row's response does not depend on
        # what else is in the batch, and the ranks of a TP group draw the same tokens. A request
        # of n gets the seed of its first row; vLLM seeds its sample i with seed + i, row i's seed.
        base = request_seed_base(seed, self.ctx.rank // self.tp)
        params = [SamplingParams(seed=base + r * n, **{**kwargs, "n": n}) for r in range(len(prompts))]
        lora_request = self.adapter.request if self.adapter is not None else None
        counts, start = device_memory.allocator_counts(), time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=lora_request)
        seconds = time.perf_counter() - start
        # the engine awake with its KV cache: the step's device_memory_used_gib includes this moment
        metrics = {"rollout/device_memory_used_gib": device_memory.note_phase_end()}
        metrics.update(device_memory.allocator_metrics("rollout", counts))
        samples = completions_in_row_order(outputs, n, token_lists)
        logprobs = None
        if self.settings.calculate_log_probs:
            logprobs = [s.logprobs.logprobs for s in samples]  # FlatLogprobs: one per sampled token
        responses, mask, rollout_logprobs = responses_to_tensors(
            [s.token_ids for s in samples], logprobs, self.spec.lengths.response, self.pad_id
        )
        tokens = int(mask.sum())
        metrics.update({"rollout/tokens_per_s": tokens / max(seconds, 1e-9), "rollout/generate_s": seconds})
        metrics.update(self.memory)
        self.memory = {}
        out = Batch({"responses": responses, "response_mask": mask, "rollout_logprobs": rollout_logprobs})
        return out, metrics

    def _episodes(self, batch: Batch, kwargs: dict, seed_base: int) -> tuple[Batch, dict]:
        """Multi-turn episodes (dagrl/rollout), each advancing on its own in the running engine."""
        lora_request = self.adapter.request if self.adapter is not None else None
        sampler = VLLMStepSampler(self.llm, kwargs, seed_base, lora_request)
        prompts = prompt_token_lists(batch["prompts"], batch["prompt_mask"])
        tensors, metrics = self.multi_turn.generate(sampler, prompts, batch_rows(batch, len(batch)))
        # the engine still awake with its KV cache, as after a single-turn generate
        metrics["rollout/device_memory_used_gib"] = device_memory.note_phase_end()
        metrics.update(self.memory)
        self.memory = {}
        return Batch(tensors), metrics

    def shutdown(self) -> None:
        """Free the engine before the process exits (vLLM's exit-time teardown with sleep mode
        can crash a process that still holds it)."""
        llm, self.llm, self.model = self.llm, None, None
        del llm
