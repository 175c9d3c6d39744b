"""Rollout on HF transformers: batched sampling with a KV cache.

Temperature, top-p, top-k; stops at EOS (not with rollout.ignore_eos, as vLLM) or
max_response_length; returns the log-prob of each
sampled token under the temperature-scaled distribution (what the trainer recomputes).
Temperature 0 is greedy decoding (argmax); its tokens' log-probs are the model's own, at
temperature 1 (see `dagrl.algos.logprob_temperature`).
Sampling is seeded per (step seed, DP rank), so a resumed run samples what the original would.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch

from dagrl.algos import logprob_temperature
from dagrl.backends.hf.multi_turn import HFTurnSampler
from dagrl.backends.hf_model import eos_token_ids, load_causal_lm, load_tokenizer, resolve_model_path
from dagrl.config.roles import RoleSpec
from dagrl.core.batch import Batch
from dagrl.errors import DagrlError
from dagrl.rollout.multi_turn import MultiTurnRollout, batch_rows


class HFRolloutBackend:
    def __init__(self, spec: RoleSpec, ctx):
        """The spec's model (a distill sampler's is the teacher's) in the spec's dtype, sampling
        as its `rollout` section says, responses up to `spec.lengths.response` tokens."""
        assert spec.rollout is not None, f"role {spec.name!r}: a rollout spec carries its rollout section"
        self.spec, self.ctx, self.settings = spec, ctx, spec.rollout
        self.max_response = spec.lengths.response
        path = resolve_model_path(spec.model.path)
        trust = spec.model.trust_remote_code
        self.model = load_causal_lm(path, spec.model.dtype, ctx.device, trust).eval()
        self.model.requires_grad_(False)
        tok = load_tokenizer(path, trust)
        self.eos_ids = eos_token_ids(tok, self.model.generation_config)
        self.pad_id = tok.pad_token_id
        mt = self.settings.multi_turn
        self.multi_turn = (
            MultiTurnRollout(mt, tok, self.max_response, self.eos_ids, self.pad_id) if mt.enable else None
        )
        self.params = dict(self.model.named_parameters())
        self.params.update(dict(self.model.named_buffers()))

    def dp_info(self) -> tuple[int, int, bool]:
        return self.ctx.rank, self.ctx.world_size, True

    def offload(self) -> None:
        self.model.to("cpu")

    def onload(self) -> None:
        self.model.to(self.ctx.device)

    def begin_weight_update(self) -> None:
        self.onload()

    def finish_weight_update(self) -> None:
        pass

    def engine_params(self) -> dict[str, torch.Tensor]:
        """The parameters a direct weight refresh writes into (weight_layout.py); buffers do not
        train, so they stay out of it."""
        return dict(self.model.named_parameters())

    def load_weights(self, buckets: Iterable[dict[str, torch.Tensor]]) -> int:
        nbytes = 0
        with torch.no_grad():
            for bucket in buckets:
                for name, tensor in bucket.items():
                    target = self.params.get(name)
                    if target is None:  # e.g. lm_head.weight when tied: already shares embed_tokens
                        continue
                    target.copy_(tensor, non_blocking=True)
                    nbytes += tensor.numel() * tensor.element_size()
        return nbytes

    @torch.no_grad()
    def generate(self, batch: Batch, seed: int, validate: bool = False) -> tuple[Batch, dict]:
        r = self.settings
        s = r.val_kwargs if validate else r
        greedy = (validate and not r.val_kwargs.do_sample) or s.temperature <= 0
        gen = torch.Generator(device=self.ctx.device).manual_seed(seed * 1000003 + self.ctx.rank)
        if self.multi_turn is not None:
            sampler = HFTurnSampler(
                self, gen, (s.temperature, s.top_p, s.top_k, greedy), r.micro_batch_size_per_gpu
            )
            prompts = [p[m.bool()].tolist() for p, m in zip(batch["prompts"], batch["prompt_mask"])]
            tensors, metrics = self.multi_turn.generate(sampler, prompts, batch_rows(batch, len(batch)))
            return Batch(tensors), metrics
        start = time.perf_counter()
        outs = [
            self._generate(mb, gen, s.temperature, s.top_p, s.top_k, greedy)
            for mb in batch.chunks(r.micro_batch_size_per_gpu)
        ]
        # fixed width: DP shards (and micro-batches) stop at different lengths but must concatenate
        width = self.max_response
        responses = _pad_right([o[0] for o in outs], self.pad_id, width)
        mask = _pad_right([o[1] for o in outs], 0, width)
        logprobs = _pad_right([o[2] for o in outs], 0.0, width)
        seconds = time.perf_counter() - start
        tokens = int(mask.sum())
        metrics = {"rollout/tokens_per_s": tokens / max(seconds, 1e-9)}
        return Batch({"responses": responses, "response_mask": mask, "rollout_logprobs": logprobs}), metrics

    def _generate(
        self,
        mb: Batch,
        gen,
        temperature: float,
        top_p: float,
        top_k: int,
        greedy: bool,
        max_new: int | None = None,
    ):
        dev = self.ctx.device
        max_new = max_new or self.max_response
        ids, attn = mb["prompts"].to(dev), mb["prompt_mask"].to(dev)
        pos = (attn.cumsum(1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        cache_name, past = _kv_cache(self.model, out)
        logits = out.logits[:, -1].float()
        next_pos = pos[:, -1:] + 1
        alive = torch.ones(ids.shape[0], dtype=torch.bool, device=dev)
        tokens, masks, logps = [], [], []
        eos = torch.tensor([] if self.settings.ignore_eos else self.eos_ids, dtype=torch.long, device=dev)
        for _ in range(max_new):
            token, logp = _sample(logits, gen, temperature, top_p, top_k, greedy)
            token = torch.where(alive, token, torch.full_like(token, self.pad_id))
            tokens.append(token)
            masks.append(alive.long())
            logps.append(torch.where(alive, logp, torch.zeros_like(logp)))
            alive = alive & ~torch.isin(token, eos)
            if not alive.any():
                break
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            out = self.model(
                input_ids=token[:, None],
                attention_mask=attn,
                position_ids=next_pos,
                use_cache=True,
                **{cache_name: past},
            )
            past, logits, next_pos = getattr(out, cache_name), out.logits[:, -1].float(), next_pos + 1
        return torch.stack(tokens, 1).cpu(), torch.stack(masks, 1).cpu(), torch.stack(logps, 1).cpu()


# transformers 5.x names the KV cache `cache` (argument and output); 4.x `past_key_values`. 5.x
# still reads the old name with a deprecation warning, until it drops it: a cache passed under a
# name the forward no longer knows lands in its **kwargs and is ignored, and every step would
# decode from the last token alone. So the cache goes back under the name the output gave it.
CACHE_NAMES = ("cache", "past_key_values")


def _kv_cache(model, out) -> tuple[str, object]:
    """(name, cache) of the KV cache in the prefill's output; a model that returns none is refused."""
    for name in CACHE_NAMES:
        cache = getattr(out, name, None)
        if cache is not None:
            return name, cache
    raise DagrlError(
        f"the hf rollout's model ({type(model).__name__}) returned no KV cache (neither `cache` nor"
        " `past_key_values` in its output with use_cache=True), so it cannot decode token by token;"
        " use a transformers causal LM that returns one, or actor_rollout_ref.rollout.name=vllm"
    )


def _sample(logits: torch.Tensor, gen, temperature: float, top_p: float, top_k: int, greedy: bool):
    """Next token [B] and its log-prob under softmax(logits / temperature) [B] (greedy: argmax, and
    its log-prob at temperature 1, as the trainer scores it)."""
    t = logprob_temperature(temperature)
    logprobs = torch.log_softmax(logits / t, dim=-1)
    if greedy:
        token = logits.argmax(-1)
        return token, logprobs.gather(-1, token[:, None])[:, 0]
    filtered = logits / t
    if top_k > 0:
        kth = torch.topk(filtered, min(top_k, filtered.shape[-1]), dim=-1).values[:, -1:]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(filtered, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, -1).cumsum(-1)
        drop = cum - torch.softmax(sorted_logits, -1) > top_p  # keep the token that crosses top_p
        filtered = filtered.scatter(-1, idx, sorted_logits.masked_fill(drop, float("-inf")))
    token = torch.multinomial(torch.softmax(filtered, -1), 1, generator=gen)[:, 0]
    return token, logprobs.gather(-1, token[:, None])[:, 0]


def _pad_right(parts: list[torch.Tensor], value, width: int) -> torch.Tensor:
    padded = [torch.nn.functional.pad(p, (0, width - p.shape[1]), value=value) for p in parts]
    return torch.cat(padded)
