"""Mixed precision and optimizer CPU offload settings: refused where a backend cannot honour them
(backends/megatron/precision_rules.py, backends/torch/rules.py), verl / ms-swift names, megatron-core's OptimizerConfig built from them."""

from __future__ import annotations

import pytest
import torch

from dagrl.config.compat import translate
from dagrl.errors import ConfigError
from dagrl.trainer.setup import prepare
from tests.config.test_megatron_config import DENSE, dense_params, end_stage, estimate, qwen3_dir
from tests.conftest import compose_config, validated_config

A = "actor_rollout_ref.actor"
M = f"{A}.megatron"
MEGATRON = (f"{A}.strategy=megatron", "trainer.device=cpu")


_validate = validated_config


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (("actor_rollout_ref.model.dtype=float16",), "actor_rollout_ref.model.dtype"),
        ((f"{M}.optimizer_cpu_offload=true",), f"{M}.optimizer_cpu_offload"),
        ((*MEGATRON, f"{A}.optimizer_cpu_offload=true"), f"{A}.optimizer_cpu_offload"),
        ((*MEGATRON, f"{M}.optimizer_offload_fraction=0.5"), f"{M}.optimizer_offload_fraction"),
        ((*MEGATRON, f"{M}.optimizer_cpu_offload=true"), f"{M}.optimizer_cpu_offload"),  # no CUDA
        (
            (*MEGATRON, f"{M}.use_precision_aware_optimizer=true", f"{M}.use_distributed_optimizer=false"),
            f"{M}.use_precision_aware_optimizer",
        ),
        (
            ("actor_rollout_ref.ref.megatron.optimizer_cpu_offload=true",),
            "actor_rollout_ref.ref.megatron.optimizer_cpu_offload",
        ),
    ],
    ids=[
        "torch-fp16",
        "torch-megatron-key",
        "megatron-torch-key",
        "fraction-alone",
        "megatron-on-cpu",
        "precision-aware-replicated",
        "ref",
    ],
)
def test_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        _validate(*overrides)
    assert err.value.key == key


CRITIC = ("algorithm=ppo", "critic.strategy=megatron")


@pytest.mark.parametrize("share", [None, 0.5], ids=["whole", "half"])
@pytest.mark.parametrize(
    ("section", "role"),
    [(M, (f"{A}.strategy=megatron",)), ("critic.megatron", CRITIC)],
    ids=["actor", "critic"],
)
def test_cpu_optimizer_needs_the_distributed_optimizer(section, role, share):
    """megatron-core 0.16.1 cannot step its CPU optimizer outside the distributed optimizer
    (tests/backends/megatron/test_optimizer.py): the dry run planned it and the run failed at its
    first step. Refused before any worker starts, naming the fix; with it the job is planned."""
    fraction = () if share is None else (f"{section}.optimizer_offload_fraction={share}",)
    offload = (*role, "trainer.device=cuda", "trainer.dry_run=true", f"{section}.optimizer_cpu_offload=true")
    with pytest.raises(ConfigError) as err:
        prepare(compose_config(*offload, *fraction, f"{section}.use_distributed_optimizer=false"))
    assert (err.value.key, err.value.value) == (f"{section}.optimizer_cpu_offload", True)
    assert f"set {section}.use_distributed_optimizer=true" in err.value.fix
    prepare(compose_config(*offload, *fraction))


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (("trainer.device=cpu", "critic.megatron.optimizer_cpu_offload=true"), "optimizer_cpu_offload"),
        (("critic.megatron.optimizer_offload_fraction=0.5",), "optimizer_offload_fraction"),
        (
            (
                "critic.megatron.use_precision_aware_optimizer=true",
                "critic.megatron.use_distributed_optimizer=false",
            ),
            "use_precision_aware_optimizer",
        ),
    ],
    ids=["on-cpu", "fraction-alone", "precision-aware-replicated"],
)
def test_the_megatron_critics_optimizer_is_held_to_the_actors_rules(overrides, key):
    """critic.megatron builds its optimizer as the actor's section does (build_optimizer): its
    knobs were accepted unchecked, then ignored or failed in the worker."""
    with pytest.raises(ConfigError) as err:
        prepare(compose_config(*CRITIC, "trainer.dry_run=true", *overrides))
    assert err.value.key == f"critic.megatron.{key}"


def test_torch_bf16_and_cpu_offload_are_accepted():
    cfg = _validate("actor_rollout_ref.model.dtype=bfloat16", f"{A}.optimizer_cpu_offload=true")
    assert cfg.actor_rollout_ref.actor.optimizer_cpu_offload


def test_verl_and_ms_swift_names_land_on_megatron_keys():
    verl = f"+{A}.optim.override_optimizer_config"
    got = translate(
        [
            f"{verl}.optimizer_cpu_offload=True",
            f"{verl}.optimizer_offload_fraction=1",
            "overlap_cpu_optimizer_d2h_h2d=true",
        ]
    )
    assert got == [
        f"{M}.optimizer_cpu_offload=True",
        f"{M}.optimizer_offload_fraction=1",
        f"{M}.overlap_cpu_optimizer_d2h_h2d=true",
    ]
    with pytest.raises(ConfigError, match="override_optimizer_config.fp8_recipe"):
        translate([f"{verl}.fp8_recipe=blockwise"])


def test_megatron_optimizer_config_carries_the_offload_knobs():
    pytest.importorskip("megatron.core")
    from dagrl.backends.megatron.optimizer import optimizer_config

    cfg = compose_config(
        *MEGATRON,
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"{M}.optimizer_cpu_offload=true",
        f"{M}.optimizer_offload_fraction=0.5",
        f"{M}.overlap_cpu_optimizer_d2h_h2d=true",
    )
    actor = cfg.actor_rollout_ref.actor
    got = optimizer_config(actor, actor.megatron, torch.bfloat16)
    assert got.optimizer_cpu_offload and got.optimizer_offload_fraction == 0.5
    assert got.overlap_cpu_optimizer_d2h_h2d and got.bf16 and not got.fp16 and got.lr == 1e-6
    plain = optimizer_config(
        actor, compose_config(*MEGATRON).actor_rollout_ref.actor.megatron, torch.bfloat16
    )
    assert not plain.optimizer_cpu_offload and plain.optimizer_offload_fraction == 0.0


def test_memory_estimate_counts_masters_and_cpu_offload(tmp_path, monkeypatch):
    """Bytes per parameter on the device (TP 2 × PP 4, DP 1, an end stage's): megatron bf16 2 + 4 grads + 12
    (master, m, v); the CPU optimizer takes its share of them to the host, with its pinned gradients.
    torch (one device): bf16 2 + 2 + 12, with the host step 2 + 2."""
    from dagrl.backends.megatron import probes

    monkeypatch.setattr(probes, "transformer_engine_available", lambda: True)
    model = qwen3_dir(tmp_path / "qwen3")
    params, gib = dense_params(DENSE), 2**30
    stage = end_stage(DENSE, 2, 4)  # an end stage's device: a quarter of the layers, a vocabulary matrix
    sizes = (f"{M}.tensor_model_parallel_size=2", f"{M}.pipeline_model_parallel_size=4")
    cpu = f"{M}.optimizer_cpu_offload=true"
    # the memory plan's figures (backends/megatron/memory.py): while another role runs, the CPU
    # optimizer's share of master, m and v is on the host, the gradient buffers are freed, and
    # precision-aware (auto with the CPU optimizer) keeps no fp32 main params on the device
    plan = estimate(model, *sizes, cpu)
    assert plan.memory_gib["train"] == pytest.approx(stage * 2 / gib)
    # on the host the last stage's CPU optimizer (two layers, the final norm and the output layer:
    # 45,440 elements at TP 2): 12 pageable bytes each, the pinned fp32 gradients each rounded up to
    # a power of two (181,760 bytes) and the bf16 copies' cached blocks no gradient takes (4,256:
    # backends/megatron/optimizer_host.py); 16 bytes a parameter of an even stage read 723,584
    assert plan.offloaded_gib["train"] * gib == pytest.approx(12 * 45_440 + 181_760 + 4_256)
    plan = estimate(model, *sizes, cpu, f"{M}.use_precision_aware_optimizer=true")
    assert plan.memory_gib["train"] == pytest.approx(stage * 2 / gib)
    # precision-aware pinned off: the distributed optimizer's fp32 main params stay on the device
    plan = estimate(model, *sizes, cpu, f"{M}.use_precision_aware_optimizer=false")
    assert plan.memory_gib["train"] == pytest.approx(stage * 6 / gib)
    plan = estimate(model, *sizes, cpu, f"{M}.optimizer_offload_fraction=0.5")
    assert plan.memory_gib["train"] == pytest.approx(stage * 8 / gib)  # weights + half of 12
    # between phases: bf16 weights 2 + fp32 master, m, v 12 (the bf16 gradients live only inside the
    # update: the masters take and free them); with the step on the host, the weights alone
    for extra, per_param in (((), 14), ((f"{A}.optimizer_cpu_offload=true",), 2)):
        cfg = compose_config(
            f"actor_rollout_ref.model.path={model}",
            f"{A}.optim.lr=1e-6",
            "actor_rollout_ref.model.dtype=bfloat16",
            "trainer.device=cuda",
            "trainer.dry_run=true",
            f"{A}.offload=false",  # the figure is what stays on the device between phases
            *extra,
        )
        assert prepare(cfg).plan.memory_gib["train"] == pytest.approx(params * per_param / gib)


def test_precision_aware_cpu_optimizer_needs_no_transformer_engine():
    """megatron-core reads TE's version for a precision-aware config; on the CPU-offload path it only
    picks store_param_remainders (TE's FusedAdam's), so dagrl sets the flags itself without TE."""
    pytest.importorskip("megatron.core")
    from dagrl.backends.megatron.optimizer import optimizer_config
    from dagrl.backends.megatron.probes import transformer_engine_available

    if transformer_engine_available():
        pytest.skip("TE installed: megatron-core builds the config itself")
    cfg = compose_config(
        *MEGATRON, f"{M}.optimizer_cpu_offload=true", f"{M}.use_precision_aware_optimizer=true"
    )
    actor = cfg.actor_rollout_ref.actor
    got = optimizer_config(actor, actor.megatron, torch.bfloat16)
    assert got.use_precision_aware_optimizer and got.use_precision_aware_optimizer_no_fp8_or_ds_fp8
    assert got.optimizer_cpu_offload and not got.store_param_remainders
    with pytest.raises(ConfigError) as err:  # on the device it is TE's FusedAdam or nothing
        _validate(*MEGATRON, f"{M}.use_precision_aware_optimizer=true")
    assert err.value.key == f"{M}.use_precision_aware_optimizer"
