"""A generative judge on vLLM (reward.model.type=generative, reward.model.engine=vllm): the same
contract as dagrl/backends/judge.py's HF judge (judge prompt texts in, answer texts out, greedy),
decoded by an in-process engine shard per worker (backends/vllm/engine.py; consecutive ranks form
a TP group, each group a replica that takes its share of the rows). The engine runs without its
tokenizer: the judge's HF tokenizer renders its chat template and decodes the answers here, so
prompts that do not fit max_model_len are left out (None) before the engine sees them.
"""

from __future__ import annotations

import time

import torch

from dagrl.backends.hf_model import eos_token_ids, load_tokenizer, resolve_model_path
from dagrl.backends.judge import judge_prompt_ids, model_context
from dagrl.backends.vllm.engine import start_engine
from dagrl.core.batch import Batch
from dagrl.core.calls import Collect, Dispatch, Execute, role_method

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def judge_llm_kwargs(spec, path: str, context: int) -> dict:
    """`vllm.LLM` arguments of a judge shard: the judge's own model, its context `context`;
    reward.model.engine_kwargs (the spec's `reward_model` section) go last."""
    m = spec.reward_model
    kwargs = dict(
        model=path,
        dtype=_DTYPES.get(spec.model.dtype, "bfloat16"),
        trust_remote_code=spec.model.trust_remote_code,
        tensor_parallel_size=1,
        gpu_memory_utilization=m.gpu_memory_utilization,
        max_model_len=context,
        enable_prefix_caching=True,  # every judge prompt starts with the same template text
        enable_sleep_mode=False,
        seed=spec.seed,
        distributed_executor_backend="external_launcher",
        skip_tokenizer_init=True,
        generation_config="vllm",
        disable_custom_all_reduce=True,
    )
    kwargs.update(m.engine_kwargs)
    return kwargs


def judge_context(spec, model_positions: int) -> int:
    """The judge's context: room for the policy's prompt and response (the spec's lengths), 512
    tokens of template and the answer, or the judge model's own positions if fewer."""
    return min(spec.lengths.total + spec.reward_model.judge_max_new_tokens + 512, model_positions)


class VLLMJudgeBackend:
    def __init__(self, spec, ctx):
        """Built from role rm's spec: its model, seed, lengths and `reward_model` section."""
        assert ctx.device.type == "cuda", "validate refuses a vLLM judge off the GPU"
        self.ctx, self.max_new = ctx, spec.reward_model.judge_max_new_tokens
        path = resolve_model_path(spec.model.path)
        self.tokenizer = load_tokenizer(path, spec.model.trust_remote_code)
        from transformers import AutoConfig, GenerationConfig

        config = AutoConfig.from_pretrained(path, trust_remote_code=spec.model.trust_remote_code)
        self.context = judge_context(spec, model_context(config))
        kwargs = judge_llm_kwargs(spec, path, self.context)
        self.llm, _, self.start_s = start_engine(kwargs, ctx.rank, ctx.world_size, spec.card_gib)

        try:
            gen = GenerationConfig.from_pretrained(path)
        except OSError:  # no generation_config.json: the tokenizer's EOS alone
            gen = None
        self.eos = eos_token_ids(self.tokenizer, gen)

    def dp_info(self) -> tuple[int, int, bool]:
        return self.ctx.rank, self.ctx.world_size, True

    def offload(self) -> bool:
        return False  # the engine keeps its share of the GPU (gpu_memory_utilization)

    def onload(self) -> None:
        pass

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def judge(self, batch: Batch) -> Batch:
        """judge_outputs: the greedy answer to each of `judge_prompts` (None where it did not fit)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids = judge_prompt_ids(self.tokenizer, list(batch["judge_prompts"]), self.context, self.max_new)
        todo = [i for i, x in enumerate(ids) if x is not None]
        params = SamplingParams(
            n=1, temperature=0.0, max_tokens=self.max_new, stop_token_ids=list(self.eos), detokenize=False
        )
        start = time.perf_counter()
        outputs = (
            []
            if not todo
            else self.llm.generate(
                [TokensPrompt(prompt_token_ids=ids[i]) for i in todo], params, use_tqdm=False
            )
        )
        self.last_seconds = time.perf_counter() - start
        answers: list[str | None] = [None] * len(ids)
        for i, out in zip(todo, outputs):
            answers[i] = self.tokenizer.decode(list(out.outputs[0].token_ids), skip_special_tokens=True)
        return Batch(meta={"judge_outputs": answers})

    def shutdown(self) -> None:
        llm, self.llm = self.llm, None
        del llm
        torch.cuda.empty_cache()
