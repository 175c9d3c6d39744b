"""The policy's LoRA adapter in an in-process vLLM engine, refreshed from tensors in memory.

vLLM (0.26) loads adapters for requests from a directory (`WorkerLoRAManager._load_adapter` reads
`adapter_config.json` and the weights file named by `LoRARequest.lora_path`). A sync must not
write the adapter to disk every step, so the tensors go to the engine's own LoRA manager
directly: `LLM.collective_rpc` runs `_install` on the worker (in this process: the engine is
in-process, nothing is serialised), which builds vLLM's `LoRAModel` from the tensors with the
same PEFT config parsing and mapping as a loaded directory and puts it in place of the previous
adapter under the same id (registered, then activated into the GPU slot). Requests then name
the adapter by that id; since it is already registered, vLLM never reads `lora_path`.

verl reaches the same end with a LoRARequest subclass carrying the tensors and a patched
`_load_adapter`; installing through the manager's public add/activate methods patches nothing.
"""

from __future__ import annotations

from typing import Any

from dagrl.backends.vllm.engine_args import adapter_peft_config

ADAPTER_ID = 1  # vLLM's adapter ids start at 1; the policy is the engine's one adapter
ADAPTER_NAME = "dagrl-policy"
UNUSED_PATH = "/dagrl/in-memory-adapter"  # never read: the adapter is registered before any request


class PolicyAdapter:
    """The policy's adapter in one engine shard: `install` each sync, `request` for generation
    (None until the first sync: the fresh adapter's B is zero, so the base samples the same)."""

    def __init__(self, llm, lora):
        self.llm = llm
        self.config = adapter_peft_config(lora)
        self.request = None

    def install(self, tensors: dict[str, Any]) -> None:
        """PEFT-named adapter tensors (`base_model.model.<module>.lora_A.weight`, on any device)."""
        from vllm.lora.request import LoRARequest

        self.llm.collective_rpc(_install, args=(self.config, tensors, ADAPTER_ID))
        self.request = LoRARequest(lora_name=ADAPTER_NAME, lora_int_id=ADAPTER_ID, lora_path=UNUSED_PATH)


def _install(worker, config: dict, tensors: dict, adapter_id: int) -> int:
    """Run on the vLLM worker: the adapter built from `tensors`, replacing the one under
    `adapter_id` and active in a GPU slot. Returns the number of adapted modules."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    workers_manager = worker.model_runner.lora_manager  # LRUCacheWorkerLoRAManager
    helper = PEFTHelper.from_dict(
        {**config, "vllm_max_position_embeddings": workers_manager.max_position_embeddings}
    )
    helper.validate_legal(workers_manager.lora_config)  # rank within max_lora_rank, no bias
    manager = workers_manager._adapter_manager  # the model's LoRA layers and the adapter cache
    model = manager.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)  # as _load_adapter maps a directory's names
    adapter = LoRAModel.from_lora_tensors(
        adapter_id,
        tensors,
        helper,
        device="cpu",  # the manager keeps registered adapters on the host, copies into GPU slots
        dtype=workers_manager.lora_config.lora_dtype,
        model_vocab_size=workers_manager.vocab_size,
        weights_mapper=mapper.get_unstacked_mapper() if mapper is not None else None,
        skip_prefixes=getattr(model, "lora_skip_prefixes", None),
    )
    manager.remove_adapter(adapter_id)  # frees its GPU slot; a no-op at the first sync
    manager.add_adapter(adapter)  # packs q/k/v and gate/up into vLLM's fused layers
    manager.activate_adapter(adapter_id)
    return len(adapter.loras)
