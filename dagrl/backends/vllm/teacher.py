"""A standalone distillation teacher on vLLM: replicas on GPUs of their own that return the
teacher's top-k log-probs at every response position of the student's samples.

Each worker holds one in-process engine shard (dagrl/backends/vllm/engine.py); a TP group is one
replica and the replicas share the batch (data parallel, `dp_info`). A request is the prompt (the
student's, or the row's `teacher_prompts` for OPSD) followed by the response's token ids, scored
with `prompt_logprobs=k` and `max_tokens=1`: vLLM's log-probs of every prompt position, whose
top-k at the response positions are the [B, R, K] the GKD loss reads (convert.py). A multi-turn
response is scored whole (its observations included, `response_attention_mask`): they are real
tokens the student's turns were sampled after; the loss counts only the policy's.

Temperature: vLLM's prompt log-probs are a log-softmax of the model's logits, before any sampling
processor (logprobs_mode does not change that). The colocated teacher returns
`log_softmax(logits / T)` (algorithm.gkd.temperature), so this one sets the scale of vLLM's own
logits layer to 1/T: the same distribution, computed by the engine, top-k included.
"""

from __future__ import annotations

import time

import torch

from dagrl.backends.hf_model import resolve_model_path
from dagrl.backends.vllm.convert import prompt_logprobs_to_topk, teacher_request_ids
from dagrl.backends.vllm.engine import start_engine
from dagrl.backends.vllm.engine_args import teacher_llm_kwargs, teacher_sampling_kwargs
from dagrl.config.roles import RoleSpec
from dagrl.core.batch import Batch, response_attention


def scoring_inputs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt the teacher reads: the row's teacher prompt (OPSD) when the batch has one."""
    if "teacher_prompts" in batch:
        return batch["teacher_prompts"], batch["teacher_prompt_mask"]
    return batch["prompts"], batch["prompt_mask"]


class VLLMTeacherBackend:
    def __init__(self, spec: RoleSpec, ctx):
        """Replica shards of the teacher's model: its spec's dtype, TP size, sequence limits and
        engine_kwargs (teacher.engine_kwargs)."""
        assert ctx.device.type == "cuda", "validate refuses a standalone teacher off the GPU"
        self.spec, self.ctx = spec, ctx
        self.tp = spec.parallel.tp
        path = resolve_model_path(spec.model.path)
        kwargs = teacher_llm_kwargs(spec, path)
        self.llm, self.model, self.start_s = start_engine(kwargs, ctx.rank, ctx.world_size, spec.card_gib)
        # vLLM's LogitsProcessor multiplies the logits by `scale` (1.0 for Qwen/Llama) before
        # any log-probs are taken, prompt log-probs included
        self.logits_layer = getattr(self.model, "logits_processor", None)
        self.base_scale = getattr(self.logits_layer, "scale", None)

    # ---- placement: the teacher owns its GPUs, so there is nothing to hand over -------------------
    def dp_info(self) -> tuple[int, int, bool]:
        """A TP group is one replica: its ranks get the same shard, its first rank returns it."""
        return self.ctx.rank // self.tp, self.ctx.world_size // self.tp, self.ctx.rank % self.tp == 0

    def offload(self) -> bool:
        return False

    def onload(self) -> None:
        pass

    def _set_temperature(self, temperature: float) -> None:
        if self.base_scale is None:
            if temperature != 1.0:
                raise RuntimeError(
                    f"{type(self.model).__name__} has no vLLM logits_processor to scale by 1/temperature;"
                    " run it with algorithm.gkd.temperature=1.0 or teacher.placement=colocate"
                )
            return
        self.logits_layer.scale = self.base_scale / temperature

    # ---- scoring ---------------------------------------------------------------------------------
    @torch.no_grad()
    def teacher_topk(self, batch: Batch, k: int, temperature: float) -> tuple[Batch, dict]:
        """teacher_topk_ids / teacher_topk_logprobs [B, R, K] of this worker's shard."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._set_temperature(temperature)
        prompts, prompt_mask = scoring_inputs(batch)
        # multi-turn rows: every real response token, observations too (the loss masks them)
        responses, response_mask = batch["responses"], response_attention(batch)
        requests, prompt_lens = teacher_request_ids(prompts, prompt_mask, responses, response_mask)
        params = SamplingParams(**teacher_sampling_kwargs(k))
        start = time.perf_counter()
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in requests], params, use_tqdm=False
        )
        seconds = time.perf_counter() - start
        response_lens = response_mask.sum(dim=1).tolist()
        ids, logprobs, missing = prompt_logprobs_to_topk(
            [o.prompt_logprobs for o in outputs], prompt_lens, response_lens, k, responses.shape[1]
        )
        tokens = sum(len(r) for r in requests)
        metrics = {
            "teacher/score_s": seconds,
            "teacher/tokens_per_s": tokens / max(seconds, 1e-9),
            "teacher/convert_s": time.perf_counter() - start - seconds,
        }
        if missing:
            metrics["teacher/missing_positions"] = float(missing)
        return Batch({"teacher_topk_ids": ids, "teacher_topk_logprobs": logprobs}), metrics

    def shutdown(self) -> None:
        llm, self.llm, self.model, self.logits_layer = self.llm, None, None, None
        del llm
