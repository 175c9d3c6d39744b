"""Role specs: one table per config, read by placement, validation and backend lookup."""

from __future__ import annotations

import pytest

from dagrl.backends import backend_names, check_backends
from dagrl.config.placement import format_plan, make_plan
from dagrl.config.role_specs import build_role_specs
from dagrl.config.roles import ParallelLayout, Role
from dagrl.config.validate import resolve_defaults, validate_roles
from dagrl.config.validate import validate as _validate
from dagrl.errors import ConfigError, PlacementError
from tests.conftest import compose_config

ROLES = {"train", "rollout", "ref"}


def validate(cfg):
    resolve_defaults(cfg)  # the built-in learning rate, as prepare() fills it
    _validate(cfg)


@pytest.mark.parametrize("placement", ["colocate", "separate"])
def test_builtin_specs_and_plans(placement):
    cfg = compose_config(f"placement={placement}", "trainer.n_gpus_per_node=4")
    specs = build_role_specs(cfg, ROLES)
    assert {n: (s.kind, s.backend, s.trains) for n, s in specs.items()} == {
        "train": ("train", "torch", True),
        "rollout": ("rollout", "hf", False),
        "ref": ("ref", "torch", False),
    }
    assert specs["train"].micro_batch_size == cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    assert specs["ref"].micro_batch_size == cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
    assert specs["rollout"].micro_batch_size == cfg.actor_rollout_ref.rollout.micro_batch_size_per_gpu
    plan = make_plan(cfg, specs, "cuda")
    assert plan.specs is specs
    check_backends(specs.values())
    if placement == "colocate":
        assert [g.roles for g in plan.groups] == [["train", "rollout", "ref"]]
    else:
        assert sorted(sorted(g.roles) for g in plan.groups) == [["ref", "train"], ["rollout"]]
    assert "train:" in format_plan(plan)


def test_megatron_layout_comes_from_the_spec():
    cfg = compose_config(
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.param_offload=true",
        "trainer.n_gpus_per_node=8",
    )
    specs = build_role_specs(cfg, ROLES)
    assert specs["train"].parallel == ParallelLayout(2, 2, 1)
    assert specs["train"].offload.params and not specs["train"].offload.optimizer
    assert specs["train"].backend == "megatron" and specs["ref"].backend == "megatron"
    plan = make_plan(cfg, specs, "cuda")
    assert (plan.roles["train"].dp, plan.roles["train"].tp, plan.roles["train"].pp) == (2, 2, 2)


def test_a_backends_own_section_is_found_by_its_config_type():
    """The specs carry the section the backend registered the class of (megatron: actor.megatron
    for the trained role, ref.megatron for the forward-only ones); torch has none of its own."""
    from dagrl.registry import BACKENDS

    cfg = compose_config("actor_rollout_ref.actor.strategy=megatron", "trainer.n_gpus_per_node=8")
    arr = cfg.actor_rollout_ref
    specs = build_role_specs(cfg, ROLES)
    assert specs["train"].megatron is arr.actor.megatron and specs["ref"].megatron is arr.ref.megatron
    assert BACKENDS.sections(cfg.critic) == {"megatron": ("megatron", cfg.critic.megatron)}
    assert BACKENDS.own_section(arr.actor, "torch") is None
    assert build_role_specs(compose_config(), ROLES)["train"].megatron is None


@pytest.mark.parametrize("on", [True, False])
def test_torch_roles_offload_per_actor_offload(on):
    """actor.offload reaches the torch train and ref backends built from the specs (a spec that
    dropped it once left the actor resident on the GPU while vLLM ran)."""
    import torch

    from dagrl.backends import build_backend
    from dagrl.core.worker import ParallelContext
    from dagrl.objectives import role_objectives

    cfg = compose_config(
        f"actor_rollout_ref.actor.offload={str(on).lower()}", "actor_rollout_ref.actor.use_kl_loss=true"
    )
    validate(cfg)
    specs = build_role_specs(cfg, ROLES)
    ctx = ParallelContext(0, 1, torch.device("cpu"))
    for role in ("train", "ref"):
        assert specs[role].offload.params is on and specs[role].offload.optimizer is on
        backend = build_backend(specs[role], ctx, role_objectives(cfg, [specs[role]]).get(role))
        assert backend.offload() is on  # False = stays resident


def test_teacher_colocated_joins_the_train_group():
    cfg = compose_config("teacher.model=/some/teacher", "teacher.dtype=bfloat16", "trainer.n_gpus_per_node=2")
    validate(cfg)
    specs = build_role_specs(cfg, ROLES | {"teacher"})
    t = specs["teacher"]
    assert (t.kind, t.backend, t.trains, t.model.path, t.model.dtype) == (
        "teacher",
        "torch",
        False,
        "/some/teacher",
        "bfloat16",
    )
    plan = make_plan(cfg, specs, "cuda")
    assert plan.groups[0].roles == ["train", "rollout", "ref", "teacher"]
    assert plan.roles["teacher"].workers == 2


def test_teacher_standalone_gets_its_own_devices():
    cfg = compose_config(
        "teacher.model=/t",
        "teacher.placement=standalone",
        "teacher.gpus=2",
        "teacher.tensor_model_parallel_size=2",
        "trainer.n_gpus_per_node=4",
    )
    validate(cfg)
    specs = build_role_specs(cfg, ROLES | {"teacher"})
    assert (specs["teacher"].backend, specs["teacher"].parallel.tp) == ("vllm", 2)
    plan = make_plan(cfg, specs, "cuda")
    teacher_group = plan.group_of("teacher")
    assert teacher_group.roles == ["teacher"] and len(teacher_group.slots) == 2
    assert plan.roles["teacher"].dp == 1 and len(plan.group_of("train").slots) == 2
    check_backends([specs["teacher"]])  # registered; vllm itself is imported on the GPU workers only
    assert "vllm" in backend_names("teacher")


@pytest.mark.parametrize(
    "overrides, key",
    [
        (
            ["teacher.placement=standalone", "teacher.gpus=3", "teacher.tensor_model_parallel_size=2"],
            "teacher.tensor_model_parallel_size",
        ),
        (["teacher.gpus=1"], "teacher.gpus"),
        (["+teacher.engine_kwargs.enforce_eager=true"], "teacher.engine_kwargs"),
    ],
)
def test_teacher_combinations_are_checked(overrides, key):
    cfg = compose_config("teacher.model=/t", *overrides)
    with pytest.raises(ConfigError) as exc:
        validate(cfg)
    assert exc.value.key == key


def test_teacher_dtype_is_a_closed_set():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as info:  # the command line refuses it, naming the key
        compose_config("teacher.model=/t", "teacher.dtype=int3")
    assert "teacher.dtype" in str(info.value) + str(info.value.__cause__)


def test_teacher_node_without_a_teacher_model():
    with pytest.raises(ConfigError) as exc:
        validate_roles(compose_config(), ROLES | {"teacher"})
    assert exc.value.key == "teacher.model"


def test_user_role_needs_a_declaration_and_a_registered_backend():
    cfg = compose_config()
    with pytest.raises(ConfigError) as exc:
        validate_roles(cfg, {"judge"})
    assert exc.value.key == "roles.judge"
    cfg = compose_config("+roles.judge=nope")
    validate_roles(cfg, {"judge"})
    spec = build_role_specs(cfg, {"judge"})["judge"]
    assert (spec.kind, spec.backend, spec.trains) == ("judge", "nope", False)
    with pytest.raises(ConfigError) as exc:
        check_backends([spec])
    assert exc.value.key == "roles.judge" and "external_plugins" in str(exc.value)


def test_registry_lists_builtins_per_kind():
    assert backend_names("train") == ["megatron", "torch"]
    assert backend_names("ref") == ["megatron", "torch"]
    assert backend_names("rollout") == ["hf", "vllm"]


def test_unknown_rollout_backend_names_the_rollout_key():
    cfg = compose_config()
    spec = build_role_specs(cfg, {"rollout"})["rollout"]
    from dataclasses import replace

    with pytest.raises(ConfigError) as exc:
        check_backends([replace(spec, backend="sglang")])
    assert exc.value.key == "actor_rollout_ref.rollout.name" and "registered: hf, vllm" in str(exc.value)


def test_parallel_layout_must_fit_the_devices():
    cfg = compose_config(
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=3"
    )
    with pytest.raises(PlacementError, match="TP×PP×CP"):
        make_plan(cfg, build_role_specs(cfg, ROLES), "cuda")


def test_user_role_declares_its_own_model_section():
    cfg = compose_config(
        "+roles.judge={backend:nope,model:/ckpt/judge,dtype:float32,micro_batch_size:4}",
        "+roles.scorer=nope",  # the string form: the backend only, the actor's model
    )
    validate_roles(cfg, {"judge", "scorer"})
    specs = build_role_specs(cfg, {"judge", "scorer"})
    judge, scorer = specs["judge"], specs["scorer"]
    assert (judge.backend, judge.model.path, judge.model.dtype) == ("nope", "/ckpt/judge", "float32")
    assert judge.micro_batch_size == judge.logprob_micro_batch_size == 4
    assert judge.backend_key == "roles.judge.backend"
    assert scorer.model.path == cfg.actor_rollout_ref.model.path and scorer.backend == "nope"
    with pytest.raises(ConfigError) as exc:
        build_role_specs(compose_config("+roles.judge={backend:nope,modle:/x}"), {"judge"})
    assert exc.value.key == "roles.judge.modle" and "model" in str(exc.value)


def test_user_role_section_carries_its_layout_and_engine_settings_to_its_spec():
    cfg = compose_config(
        "+roles.judge={backend:nope,model:/ckpt/judge,tensor_model_parallel_size:2,engine_kwargs:{port:9}}",
        "trainer.seed=7",
        "data.max_response_length=48",
    )
    judge = build_role_specs(cfg, {"judge"})["judge"]
    assert judge.parallel.tp == 2 and judge.engine_kwargs == {"port": 9}
    assert (judge.seed, judge.lengths.prompt, judge.lengths.response) == (7, cfg.data.max_prompt_length, 48)


def test_every_backend_gets_what_it_reads_from_its_spec():
    """The rollout engine's spec carries its section, seed and limits; a standalone teacher its
    engine kwargs; sampling roles are members of the one role vocabulary."""
    cfg = compose_config(
        "teacher.model=/t", "teacher.placement=standalone", "+teacher.engine_kwargs.max_logprobs=64"
    )
    specs = build_role_specs(cfg, {"rollout", "teacher"})
    rollout, teacher = specs["rollout"], specs["teacher"]
    assert rollout.rollout is cfg.actor_rollout_ref.rollout and rollout.seed == cfg.trainer.seed
    assert rollout.lengths.response == cfg.data.max_response_length
    assert teacher.rollout is None and teacher.engine_kwargs == {"max_logprobs": 64}
    assert {Role.sampler, Role.orm, Role.prm, Role.rm} <= set(Role) and Role("orm") is Role.orm
