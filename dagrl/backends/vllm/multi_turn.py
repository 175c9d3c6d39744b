"""The vLLM backend's Sampler for multi-turn episodes: continuous batching over episodes.

Each episode's next request enters the running engine (`LLMEngine.add_request`) the moment its
observation is ready, and every `step()` advances all requests in flight: while some episodes
wait on their tools, the others keep decoding, and a finished request is handed back after the
step that finished it, not when its whole turn of the batch is done. One seed per (episode,
turn): vLLM samples by (seed, position), so an episode's tokens do not depend on what else is in
the engine.

vLLM 0.26's API as used here: `LLM.llm_engine` is the in-process V1 `LLMEngine`; `add_request`
takes an engine input (`vllm.inputs.tokens_input(ids)`, what `LLM.generate` hands it after
rendering: raw `TokensPrompt`s still work there but are deprecated) and returns vLLM's internal id
(the given one plus a random suffix); the `RequestOutput`s of `step()` carry the id *as given*
(`external_req_id`), which is what `in_engine` is keyed by. `FINAL_ONLY` outputs come once, when a
request finishes.
"""

from __future__ import annotations

from typing import Any

from dagrl.rollout.episodes import Sample

MAX_TURN_SEEDS = 16  # seeds per episode; episode k, turn t uses base + 16k + t (wrapping past 16)


class VLLMStepSampler:
    turn_synchronous = False

    def __init__(self, llm, sampling_kwargs: dict[str, Any], seed_base: int, lora_request=None):
        from vllm import SamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        self.engine = llm.llm_engine
        self.kwargs = {k: v for k, v in sampling_kwargs.items() if k != "max_tokens"}
        self.kwargs["output_kind"] = RequestOutputKind.FINAL_ONLY  # no per-token partial outputs
        self.seed_base, self._params, self._prompt = seed_base, SamplingParams, tokens_input
        self.in_engine: dict[str, int] = {}  # request id -> episode
        self.turns: dict[int, int] = {}
        self.submitted = 0
        self.lora_request = lora_request  # the policy's adapter (adapter sync), else None

    def submit(self, key: int, context: list[int], max_tokens: int) -> None:
        turn = self.turns.get(key, 0)
        self.turns[key] = turn + 1
        seed = self.seed_base + (key * MAX_TURN_SEEDS + turn) % 2**16
        params = self._params(seed=seed, max_tokens=max_tokens, **self.kwargs)
        request_id = f"episode-{key}-turn-{turn}-{self.submitted}"
        self.submitted += 1
        lora = {} if self.lora_request is None else {"lora_request": self.lora_request}
        self.engine.add_request(request_id, self._prompt(list(context)), params, **lora)
        self.in_engine[request_id] = key

    def in_flight(self) -> int:
        return len(self.in_engine)

    def poll(self) -> list[Sample]:
        """One engine step; the requests it finished (often none)."""
        samples = []
        for output in self.engine.step():
            if not output.finished or output.request_id not in self.in_engine:
                continue
            key = self.in_engine.pop(output.request_id)
            sample = output.outputs[0]
            ids = list(sample.token_ids)
            logprobs = list(sample.logprobs.logprobs) if sample.logprobs is not None else [0.0] * len(ids)
            samples.append(Sample(key, ids, logprobs))
        return samples
