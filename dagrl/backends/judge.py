"""A generative judge as a role (reward.model.type=generative): an LLM that reads a prompt made
from reward.model.judge_template and answers in text, decoded greedily.

The driver renders the judge's prompts from the policy's text (nodes/reward_model.py) and parses
the answers (rewards/judge.py); a judge backend only turns prompt texts into answer texts, with its
own tokenizer and chat template (the judge need not share the policy's vocabulary). Two engines:
`hf` (transformers' generate, any device: the CPU tests run the shipped tiny model as a judge) and
`vllm` (an in-process engine shard per worker, GPUs only: backends/vllm/judge.py). A prompt longer
than the judge's context gets no answer (None, a counted failure downstream), never an error.
"""

from __future__ import annotations

import torch

from dagrl.backends.hf_model import eos_token_ids, load_causal_lm, load_tokenizer, resolve_model_path
from dagrl.config.roles import RoleSpec
from dagrl.core.batch import Batch, declare_key, left_pad
from dagrl.core.calls import Collect, Dispatch, Execute, role_method

declare_key(
    "judge_prompts", "meta: the generative judge's prompt text of each row (its user turn)", meta=True
)
declare_key(
    "judge_outputs", "meta: the generative judge's answer text of each row (None = not judged)", meta=True
)


def judge_prompt_ids(
    tokenizer, texts: list[str], context: int, max_new_tokens: int
) -> list[list[int] | None]:
    """Each text as the judge's user turn through its chat template (plain text when it has none);
    None where prompt + max_new_tokens would not fit the judge's context."""
    out = []
    for text in texts:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
        ids = tokenizer.encode(text, add_special_tokens=False)
        out.append(ids if len(ids) + max_new_tokens <= context else None)
    return out


def model_context(config) -> int:
    return int(getattr(config, "max_position_embeddings", None) or 1 << 30)


class HFJudgeBackend:
    """Greedy answers of a causal LM to the judge prompts, with transformers' generate."""

    def __init__(self, spec: RoleSpec, ctx):
        """Built from role rm's spec: its model and `reward_model` section (reward.model.*)."""
        self.ctx, self.micro, self.max_new = (
            ctx,
            spec.micro_batch_size,
            spec.reward_model.judge_max_new_tokens,
        )
        path = resolve_model_path(spec.model.path)
        self.tokenizer = load_tokenizer(path, spec.model.trust_remote_code)
        self.model = load_causal_lm(path, spec.model.dtype, ctx.device, spec.model.trust_remote_code)
        self.model.eval().requires_grad_(False)
        self.eos = eos_token_ids(self.tokenizer, self.model.generation_config)
        self.context = model_context(self.model.config)

    def offload(self) -> bool:
        self.model.to("cpu")
        return True

    def onload(self) -> None:
        self.model.to(self.ctx.device)

    @torch.no_grad()
    def _answer(self, ids: list[list[int]]) -> list[str]:
        prompts, mask = left_pad(ids, self.tokenizer.pad_token_id)
        out = self.model.generate(
            input_ids=prompts.to(self.ctx.device),
            attention_mask=mask.to(self.ctx.device),
            max_new_tokens=self.max_new,
            do_sample=False,
            eos_token_id=self.eos,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        return self.tokenizer.batch_decode(out[:, prompts.shape[1] :].cpu(), skip_special_tokens=True)

    @role_method(dispatch=Dispatch.slice, execute=Execute.all, collect=Collect.flatten)
    def judge(self, batch: Batch) -> Batch:
        """judge_outputs: the answer to each of `judge_prompts` (None where it did not fit)."""
        ids = judge_prompt_ids(self.tokenizer, list(batch["judge_prompts"]), self.context, self.max_new)
        answers: list[str | None] = [None] * len(ids)
        todo = [i for i, x in enumerate(ids) if x is not None]
        for start in range(0, len(todo), self.micro):
            chunk = todo[start : start + self.micro]
            for i, text in zip(chunk, self._answer([ids[i] for i in chunk])):
                answers[i] = text
        return Batch(meta={"judge_outputs": answers})
