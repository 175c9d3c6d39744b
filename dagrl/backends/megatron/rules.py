"""The megatron backend's own rules, registered with it (dagrl/backends/builtin.py) and run by
validate when a role uses it, before Ray starts.

They read the model's HF config.json (heads, layers, experts must split over the parallel
sizes) and, once placement is planned, the DP sizes. Each failure is a ConfigError naming the key.
"""

from __future__ import annotations

from dagrl.backends.megatron import probes
from dagrl.backends.megatron.lora_rules import check_megatron_lora
from dagrl.backends.megatron.precision_rules import (
    changed_optimizer_knobs,
    check_megatron_precision,
    check_ref_has_no_optimizer,
)
from dagrl.config.placement import Plan
from dagrl.config.roles import Role
from dagrl.config.schema import (
    DagrlConfig,
    LayerSpec,
    MegatronConfig,
    RecomputeGranularity,
    RecomputeMethod,
    SelfTeacher,
    TeacherPlacement,
)
from dagrl.errors import ConfigError

A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"

# Megatron's process groups (parallel_state) are global to a process, so every model a process
# builds must use these sizes; a ref colocated with the actor shares the actor's processes.
PARALLEL_KNOBS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)
# What the ref copies from the actor when none of it is set (see resolve_defaults).
REF_INHERITS = (*PARALLEL_KNOBS, "sequence_parallel", "layer_spec", "param_dtype")
PARAM_DTYPES = ("bfloat16", "float16", "float32")
# HF config names of the routed-expert count (Qwen-MoE / Mixtral / DeepSeek).
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def inherit_ref_megatron(cfg: DagrlConfig) -> None:
    """A ref whose parallel settings are all left at their defaults runs with the actor's."""
    actor, ref = cfg.actor_rollout_ref.actor.megatron, cfg.actor_rollout_ref.ref.megatron
    default = MegatronConfig()
    if all(getattr(ref, k) == getattr(default, k) for k in REF_INHERITS):
        for k in REF_INHERITS:
            setattr(ref, k, getattr(actor, k))


def resolve_megatron(cfg: DagrlConfig) -> None:
    """The megatron backend's defaults that depend on other keys: the ref inherits the actor's
    layout, and verl's gradient checkpointing becomes megatron's recompute."""
    inherit_ref_megatron(cfg)
    recompute_for_checkpointing(cfg)


def check_no_megatron_knobs(cfg: DagrlConfig) -> None:
    """The torch strategy is data-parallel only: a model-parallel knob set for it would be ignored."""
    default = MegatronConfig()
    arr = cfg.actor_rollout_ref
    for prefix, m in ((f"{A}.megatron", arr.actor.megatron), (f"{REF}.megatron", arr.ref.megatron)):
        for key in (*PARALLEL_KNOBS, "sequence_parallel"):
            if getattr(m, key) != getattr(default, key):
                raise ConfigError(
                    f"{prefix}.{key}",
                    getattr(m, key),
                    f"model-parallel settings need {A}.strategy=megatron (strategy=torch is data-parallel"
                    f" only); set the strategy or leave {key} at {getattr(default, key)}",
                )


def check_megatron_unused(cfg: DagrlConfig) -> None:
    """Another train backend is chosen (the torch one, data-parallel only): the reference's
    optimizer knobs, megatron's optimizer knobs and its model-parallel knobs would be ignored."""
    check_ref_has_no_optimizer(cfg)
    m = cfg.actor_rollout_ref.actor.megatron
    for key in changed_optimizer_knobs(m):
        raise ConfigError(
            f"{A}.megatron.{key}",
            getattr(m, key),
            f"megatron's optimizer setting needs {A}.strategy=megatron; the torch backend's optimizer "
            f"CPU offload is {A}.optimizer_cpu_offload=true",
        )
    check_no_megatron_knobs(cfg)


def recompute_for_checkpointing(cfg: DagrlConfig) -> None:
    """verl/siiRL's gradient checkpointing under strategy=megatron is megatron's activation recompute:
    full recompute of every layer (uniform, 1 layer per unit) unless recompute_* are set."""
    m = cfg.actor_rollout_ref.actor.megatron
    if cfg.actor_rollout_ref.model.gradient_checkpointing and m.recompute_granularity is None:
        m.recompute_granularity = RecomputeGranularity.full
        m.recompute_method = m.recompute_method or RecomputeMethod.uniform
        m.recompute_num_layers = m.recompute_num_layers or 1


# Offload flags need no rule: each moves one thing (weights, gradients, optimizer state) to host
# memory between phases, on any device, and grad_offload without param_offload is a valid choice.


def check_megatron(cfg: DagrlConfig) -> None:
    """Rules of strategy=megatron that need the config and the model's config.json."""
    from dagrl.backends.logprob_kernel import logprob_kernel_override  # not at import: triton

    check_megatron_precision(cfg)
    logprob_kernel_override()
    hf = _hf_config(cfg)
    arr = cfg.actor_rollout_ref
    for prefix, m in ((f"{A}.megatron", arr.actor.megatron), (f"{REF}.megatron", arr.ref.megatron)):
        _check_megatron_sizes(prefix, m)
        _check_tensor_split(prefix, m, hf)
        _check_layer_split(prefix, m, hf)
        _check_expert_split(prefix, m, hf)
        _check_megatron_kernels(prefix, m)
        _check_packing(prefix, m, arr.model.use_remove_padding)
        _check_recompute(prefix, m, hf)
    _check_ref_shares_actor_groups(cfg)
    _check_distillation(cfg)
    check_megatron_lora(cfg, expert_count(hf))


def _check_distillation(cfg: DagrlConfig) -> None:
    """What the megatron train backend does not do yet for distillation."""
    G = "algorithm.gkd"
    if cfg.algorithm.gkd.sft_alpha > 0:
        raise ConfigError(
            f"{G}.sft_alpha",
            cfg.algorithm.gkd.sft_alpha,
            "the SFT term runs on the torch train backend for now: set 0",
        )
    if cfg.teacher.model in {t.value for t in SelfTeacher}:
        raise ConfigError(
            "teacher.model",
            cfg.teacher.model,
            "self-distillation runs on the torch train backend for now: set actor.strategy=torch",
        )


def check_megatron_teacher(cfg: DagrlConfig) -> None:
    """A colocated megatron teacher runs in the student's processes, so in its parallel groups
    (megatron's are per process): it uses ref.megatron, which must match the actor's layout."""
    if cfg.teacher.placement != TeacherPlacement.colocate:
        return
    mismatch = _ref_layout_mismatch(cfg)
    if mismatch is not None:
        key, ref_value, actor_value = mismatch
        raise ConfigError(
            f"actor_rollout_ref.ref.megatron.{key}",
            ref_value,
            f"the colocated teacher runs with ref.megatron in the actor's processes, whose {key} is "
            f"{actor_value}: use the same value (or leave ref.megatron's parallel settings unset)",
        )


def _hf_config(cfg: DagrlConfig):
    from transformers import AutoConfig

    from dagrl.backends.hf_model import resolve_model_path

    model = cfg.actor_rollout_ref.model
    return AutoConfig.from_pretrained(
        resolve_model_path(model.path), trust_remote_code=model.trust_remote_code
    )


def _check_megatron_sizes(prefix: str, m: MegatronConfig) -> None:
    # each size's own range (>= 1) is declared on MegatronConfig and checked before this
    vpp = m.virtual_pipeline_model_parallel_size
    if vpp is not None and m.pipeline_model_parallel_size == 1:
        raise ConfigError(
            f"{prefix}.virtual_pipeline_model_parallel_size",
            vpp,
            "virtual stages interleave a pipeline: set pipeline_model_parallel_size > 1, or leave this null",
        )
    if m.sequence_parallel and m.tensor_model_parallel_size == 1:
        raise ConfigError(
            f"{prefix}.sequence_parallel",
            True,
            "sequence parallel splits activations over the TP group: use tensor_model_parallel_size > 1,"
            " or sequence_parallel=false",
        )
    if m.param_dtype not in PARAM_DTYPES:
        raise ConfigError(f"{prefix}.param_dtype", m.param_dtype, f"use one of {list(PARAM_DTYPES)}")


def _check_tensor_split(prefix: str, m: MegatronConfig, hf) -> None:
    """Each TP rank holds an equal slice of heads, key/value groups and MLP columns (the
    vocabulary is padded to a multiple of TP instead, see backends/megatron/model.py)."""
    tp = m.tensor_model_parallel_size
    heads = hf.num_attention_heads
    why = {
        "num_attention_heads": (heads, "each TP rank holds whole attention heads"),
        "num_key_value_heads": (
            getattr(hf, "num_key_value_heads", None) or heads,
            "megatron splits the key/value (query) groups over TP",
        ),
        "intermediate_size": (getattr(hf, "intermediate_size", None), "the MLP is split column-wise"),
    }
    for field, (n, reason) in why.items():
        if n is not None and n % tp:
            raise ConfigError(
                f"{prefix}.tensor_model_parallel_size",
                tp,
                f"the model's {field} = {n} is not divisible by TP ({reason}); pick a TP that divides {n}",
            )


def _check_layer_split(prefix: str, m: MegatronConfig, hf) -> None:
    layers, pp = hf.num_hidden_layers, m.pipeline_model_parallel_size
    if layers % pp:
        raise ConfigError(
            f"{prefix}.pipeline_model_parallel_size",
            pp,
            f"the model's {layers} layers must split evenly over the pipeline stages; pick a PP that"
            f" divides {layers}",
        )
    vpp = m.virtual_pipeline_model_parallel_size
    if vpp is not None and layers % (pp * vpp):
        raise ConfigError(
            f"{prefix}.virtual_pipeline_model_parallel_size",
            vpp,
            f"PP × VPP = {pp * vpp} model chunks must each get the same number of the model's {layers}"
            f" layers; pick a VPP so that PP × VPP divides {layers}, or leave it null",
        )


def expert_count(hf) -> int:
    """Routed experts per MoE layer in a HF config; 0 for a dense model."""
    return next((getattr(hf, k) for k in EXPERT_COUNT_KEYS if getattr(hf, k, None)), 0)


def _check_expert_split(prefix: str, m: MegatronConfig, hf) -> None:
    experts, ep, etp = expert_count(hf), m.expert_model_parallel_size, m.expert_tensor_parallel_size
    if not experts:
        if ep > 1:
            raise ConfigError(
                f"{prefix}.expert_model_parallel_size",
                ep,
                f"the model has no experts (none of {list(EXPERT_COUNT_KEYS)} in its config.json); use 1",
            )
        if etp is not None:
            raise ConfigError(
                f"{prefix}.expert_tensor_parallel_size", etp, "the model has no experts; leave it null"
            )
        return
    if experts % ep:
        raise ConfigError(
            f"{prefix}.expert_model_parallel_size",
            ep,
            f"the model's {experts} experts must split evenly over EP ranks; pick an EP that divides {experts}",
        )
    ffn = getattr(hf, "moe_intermediate_size", None)
    if ffn and ffn % (etp or m.tensor_model_parallel_size):
        raise ConfigError(
            f"{prefix}.expert_tensor_parallel_size",
            etp,
            f"the model's moe_intermediate_size = {ffn} is not divisible by the expert TP size"
            f" {etp or m.tensor_model_parallel_size} (null means TP); pick one that divides it",
        )


def _check_megatron_kernels(prefix: str, m: MegatronConfig) -> None:
    """Features that only some layer specs implement (schema.LayerSpec says which)."""
    te, spec, cp = probes.transformer_engine_available(), LayerSpec(m.layer_spec), m.context_parallel_size
    if spec == LayerSpec.te and not te:
        raise ConfigError(
            f"{prefix}.layer_spec",
            spec.value,
            "TransformerEngine is not installed here; install it, or use layer_spec=sdpa (or auto)",
        )
    if cp > 1:  # checked before TransformerEngine: installing it would not help
        raise ConfigError(
            f"{prefix}.context_parallel_size",
            cp,
            "dagrl's megatron backend does not split sequences over context-parallel ranks (its"
            " log-prob, loss and packing paths assume whole sequences per rank), with or without"
            " TransformerEngine; use context_parallel_size=1 (TP with sequence_parallel also shards"
            " activations)",
        )
    if m.sequence_parallel and spec == LayerSpec.local:
        raise ConfigError(
            f"{prefix}.sequence_parallel",
            True,
            "megatron-core's local layer spec has no sequence-parallel norm: use layer_spec=sdpa, te or"
            " auto, or sequence_parallel=false",
        )


def _check_packing(prefix: str, m: MegatronConfig, packing: bool) -> None:
    """Packed rows carry an explicit block-diagonal attention mask (docs/packing.md): the sdpa and
    local specs apply it; the TE spec's causal attention would not (it needs thd packed-sequence
    parameters, not wired here). auto picks sdpa when packing is on. Context parallel, which
    would split packed rows, is refused for every layout in _check_megatron_kernels."""
    if packing and LayerSpec(m.layer_spec) == LayerSpec.te:
        raise ConfigError(
            f"{prefix}.layer_spec",
            "te",
            "actor_rollout_ref.model.use_remove_padding packs sequences behind a block-diagonal mask that"
            " the TE spec does not apply: use layer_spec=sdpa (or auto), or use_remove_padding=false",
        )


def _check_recompute(prefix: str, m: MegatronConfig, hf) -> None:
    """Megatron's activation-recompute settings (TransformerConfig rejects the same, but later, on GPUs)."""
    gran, method, n = m.recompute_granularity, m.recompute_method, m.recompute_num_layers
    # the values themselves are enums: Hydra refuses anything else at the command line
    per_stage = hf.num_hidden_layers // m.pipeline_model_parallel_size
    if gran == "full" and method is None:
        raise ConfigError(
            f"{prefix}.recompute_method",
            None,
            "recompute_granularity=full needs recompute_method=uniform or block",
        )
    if gran == "full" and (n is None or not 1 <= n <= per_stage):
        raise ConfigError(
            f"{prefix}.recompute_num_layers",
            n,
            f"recompute_granularity=full needs 1 <= recompute_num_layers <= layers per pipeline stage ({per_stage})",
        )
    if gran != "full" and (method is not None or n is not None):
        key, value = ("recompute_method", method) if method is not None else ("recompute_num_layers", n)
        raise ConfigError(
            f"{prefix}.{key}", value, "only used with recompute_granularity=full; leave it null"
        )


def _check_ref_shares_actor_groups(cfg: DagrlConfig) -> None:
    """A ref colocated with the train role runs in the actor's processes, hence in its parallel groups."""
    if not any({Role.train, Role.ref} <= set(g) for g in cfg.placement.colocate_groups):
        return
    mismatch = _ref_layout_mismatch(cfg)
    if mismatch is not None:
        key, ref_value, actor_value = mismatch
        raise ConfigError(
            f"{REF}.megatron.{key}",
            ref_value,
            f"the ref is colocated with the actor, whose {key} is {actor_value}: megatron's"
            f" parallel groups are per process, so use the same value (or leave every {REF}.megatron"
            " parallel setting unset to copy the actor's), or place the ref apart (placement=separate)",
        )


def check_megatron_plan(cfg: DagrlConfig, plan: Plan) -> None:
    """Megatron rules that need the DP sizes: expert groups and the interleaved schedule."""
    arr = cfg.actor_rollout_ref
    roles = [
        (Role.train, f"{A}.megatron", arr.actor.megatron),
        (Role.ref, f"{REF}.megatron", arr.ref.megatron),
    ]
    for role, prefix, m in roles:
        if role not in plan.roles:
            continue
        layout = plan.roles[role]
        expert_group = (
            m.expert_tensor_parallel_size or m.tensor_model_parallel_size
        ) * m.expert_model_parallel_size
        if (layout.workers // layout.pp) % expert_group:
            raise ConfigError(
                f"{prefix}.expert_model_parallel_size",
                m.expert_model_parallel_size,
                f"EP × expert TP = {expert_group} must divide the {layout.workers // layout.pp} devices of"
                f" each pipeline stage of role {role!r}; pick EP (or expert_tensor_parallel_size) to fit",
            )
    _check_interleaved_micro_batches(cfg, plan)


def _check_interleaved_micro_batches(cfg: DagrlConfig, plan: Plan) -> None:
    """Megatron's interleaved (VPP) schedule runs micro-batches in groups of PP: their count per
    pass must be a multiple of PP, for the update and for each log-prob pass."""
    arr, n = cfg.actor_rollout_ref, cfg.actor_rollout_ref.rollout.n
    if arr.actor.megatron.virtual_pipeline_model_parallel_size is not None:
        for key, on in (
            (f"{A}.use_dynamic_bsz", arr.actor.use_dynamic_bsz),
            (f"{R}.log_prob_use_dynamic_bsz", arr.rollout.log_prob_use_dynamic_bsz),
            ("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", arr.ref.log_prob_use_dynamic_bsz),
        ):
            if on:
                raise ConfigError(
                    key,
                    True,
                    "the interleaved pipeline (VPP) needs a micro-batch count that is a multiple "
                    "of PP, which a token budget cannot promise; use fixed micro-batches or no VPP",
                )
    mini, batch = arr.actor.ppo_mini_batch_size * n, cfg.data.train_batch_size * n
    passes = [  # (role, its megatron config, rows per pass, micro-batch key, micro-batch size)
        (
            Role.train,
            arr.actor.megatron,
            mini,
            f"{A}.ppo_micro_batch_size_per_gpu",
            arr.actor.ppo_micro_batch_size_per_gpu,
        ),
        (
            Role.train,
            arr.actor.megatron,
            batch,
            f"{R}.log_prob_micro_batch_size_per_gpu",
            arr.rollout.log_prob_micro_batch_size_per_gpu,
        ),
        (
            Role.ref,
            arr.ref.megatron,
            batch,
            f"{REF}.log_prob_micro_batch_size_per_gpu",
            arr.ref.log_prob_micro_batch_size_per_gpu,
        ),
    ]
    for role, m, rows, key, micro in passes:
        if role not in plan.roles or m.virtual_pipeline_model_parallel_size is None:
            continue
        per_rank = rows // plan.roles[role].dp
        count = -(-per_rank // micro)  # the last micro-batch may be short
        pp = m.pipeline_model_parallel_size
        if count % pp:
            raise ConfigError(
                key,
                micro,
                f"with virtual pipeline stages, each DP rank's {per_rank} rows must form a multiple of"
                f" PP = {pp} micro-batches (now {count}); pick a micro-batch size that gives"
                f" {pp}, {2 * pp}, ... micro-batches",
            )


def _ref_layout_mismatch(cfg: DagrlConfig) -> tuple[str, object, object] | None:
    """The first parallel setting where ref.megatron differs from the actor's: (key, ref's, actor's).
    A ref or colocated teacher runs in the actor's processes, so in its parallel groups."""
    actor, ref = cfg.actor_rollout_ref.actor.megatron, cfg.actor_rollout_ref.ref.megatron
    for key in PARALLEL_KNOBS:
        if getattr(ref, key) != getattr(actor, key):
            return key, getattr(ref, key), getattr(actor, key)
    return None
