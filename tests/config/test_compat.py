"""The command line a verl / siiRL / ms-swift user meets: aliases, refused keys, typos, --help, --cfg job."""

from __future__ import annotations

import os

import pytest
from omegaconf import OmegaConf

from dagrl.config import compat, keys
from dagrl.config.schema import TrainerConfig
from dagrl.errors import ConfigError
from dagrl.main import CONF_DIR, compose, parse_args
from tests.config.test_config import REPO, run_cli
from tests.conftest import main_in_process

M = "actor_rollout_ref.model"


def typed(*overrides: str):
    return OmegaConf.to_object(compose(list(overrides)))


def test_verl_alias_means_the_same():
    assert typed(f"{M}.enable_gradient_checkpointing=True").actor_rollout_ref.model.gradient_checkpointing
    assert typed("actor_rollout_ref.actor.optim.clip_grad=0.5").actor_rollout_ref.actor.grad_clip == 0.5
    assert typed("actor_rollout_ref.rollout.response_length=64").data.max_response_length == 64
    assert typed(f"{M}.use_remove_padding=true").actor_rollout_ref.model.use_remove_padding is True


def test_epochs_decide_when_steps_are_not_given():
    assert TrainerConfig().total_training_steps is None  # verl's default
    assert typed().trainer.total_training_steps == 40  # the default job
    t = typed("trainer.total_epochs=15").trainer
    assert (t.total_epochs, t.total_training_steps) == (15, None)
    t = typed("trainer.total_epochs=15", "trainer.total_training_steps=7").trainer
    assert (t.total_epochs, t.total_training_steps) == (15, 7)


def test_ms_swift_keys():
    cfg = typed(
        "num_generations=4", "reward_funcs=[gsm8k,arith]", "use_vllm=true", "lmbda=1.0", "train.gpus=2"
    )
    assert cfg.actor_rollout_ref.rollout.n == 4
    assert [t.name for t in cfg.reward.functions] == ["gsm8k", "arith"]
    assert cfg.actor_rollout_ref.rollout.name == "vllm"
    assert cfg.placement.gpus["train"] == 2
    # the mismatch metrics need the engine's log-probs: true asks for them, false leaves the auto
    assert typed("log_rollout_offpolicy_metrics=true").actor_rollout_ref.rollout.calculate_log_probs is True
    assert typed("log_rollout_offpolicy_metrics=false").actor_rollout_ref.rollout.calculate_log_probs is None
    # ms-swift's token-level truncated IS is verl's and dagrl's; its other modes differ and are refused
    rc = typed("rollout_importance_sampling_mode=token_truncate", "rollout_importance_sampling_threshold=3.0")
    correction = rc.algorithm.rollout_correction
    assert (correction.rollout_is.value, correction.rollout_is_threshold) == ("token", 3.0)
    for mode in ("sequence_truncate", "token_mask", "sequence_mask"):
        with pytest.raises(ConfigError) as info:
            typed(f"rollout_importance_sampling_mode={mode}")
        assert info.value.key == "rollout_importance_sampling_mode" and "rollout_is=token" in str(info.value)


def test_ms_swift_grpo_keys_say_what_they_mean_here():
    """ms-swift's GRPO command-line keys: the same concept under dagrl's key (converted where the
    values differ), the one value dagrl implements, or refused naming what to set instead."""
    cfg = typed(
        "max_grad_norm=0.5", "weight_decay=0.1", "loss_type=grpo", "scale_rewards=none",
        "dynamic_sample=true", "max_resample_times=3", "kl_in_reward=false", "vllm_mode=colocate",
        "lr_scheduler_type=constant_with_warmup", "top_entropy_quantile=1.0", "delta=null", "move_model_batches=4",
    )  # fmt: skip
    actor, algo = cfg.actor_rollout_ref.actor, cfg.algorithm
    assert (actor.grad_clip, actor.optim.weight_decay) == (0.5, 0.1)
    assert (
        actor.loss_agg_mode.value == "seq-mean-token-mean"
    )  # each response's tokens averaged, then responses
    assert algo.norm_adv_by_std_in_grpo is False
    assert (
        algo.filter_groups.enable is True and algo.filter_groups.max_num_gen_batches == 4
    )  # 1 + 3 resamples
    losses = {"bnpo": "token-mean", "dapo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}
    for name, mode in losses.items():
        assert typed(f"loss_type={name}").actor_rollout_ref.actor.loss_agg_mode.value == mode
    assert typed("scale_rewards=group").algorithm.norm_adv_by_std_in_grpo is True
    refused = {
        "loss_type=cispo": "algorithm=grpo|dr_grpo|gspo|dapo",
        "scale_rewards=batch": "no counterpart",
        "kl_in_reward=true": "algorithm.use_kl_in_reward=true",
        "vllm_mode=server": "placement=separate",
        "lr_scheduler_type=cosine": "lr_warmup_steps",
        "top_entropy_quantile=0.2": "every response token",
    }
    for override, says in refused.items():
        with pytest.raises(ConfigError) as info:
            typed(override)
        assert info.value.key == override.split("=")[0] and says in str(info.value), override


def test_only_value_keys_accept_what_dagrl_does():
    typed("data.truncation=error", "actor_rollout_ref.actor.use_dynamic_bsz=false")
    with pytest.raises(ConfigError, match="data.truncation.*dagrl supports only error"):
        compose(["data.truncation=left"])


@pytest.mark.parametrize(
    "override,says",
    [
        ("actor_rollout_ref.actor.fsdp_config.param_offload=False", "actor_rollout_ref.actor.offload"),
        ("actor_rollout_ref.ref.fsdp_config.param_offload=True", "actor_rollout_ref.ref.megatron"),
        ("trainer.max_critic_ckpt_to_keep=2", "max_actor_ckpt_to_keep keeps both"),
        ("min_lr=1e-7", "constant after warm-up"),
    ],
)
def test_concepts_dagrl_lacks_are_refused_saying_what_instead(override, says):
    with pytest.raises(ConfigError) as info:
        compose([override])
    assert info.value.key == override.split("=")[0] and says in str(info.value)


@pytest.mark.parametrize("prefix", ["", "+", "++"])
def test_a_typo_is_refused_with_the_nearest_key(prefix):
    with pytest.raises(ConfigError, match=r"did you mean 'data.train_batch_size'\?"):
        compose([f"{prefix}data.train_batch_sizee=4"])
    with pytest.raises(ConfigError, match=r"did you mean 'actor_rollout_ref.rollout.temperature'\?"):
        compose([f"{prefix}actor_rollout_ref.rollout.temperatur=0.5"])


def test_open_dicts_take_new_entries_but_not_near_misses():
    assert typed("placement.gpus.judge=1").placement.gpus["judge"] == 1
    vllm = typed("actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype=fp8")
    assert vllm.actor_rollout_ref.rollout.engine_kwargs.vllm == {"kv_cache_dtype": "fp8"}
    with pytest.raises(ConfigError, match=r"did you mean 'placement.gpus.rollout'\?"):
        compose(["placement.gpus.rollot=2"])


def test_every_table_entry_is_reachable():
    """An alias must land on a key the schema has; a refused key must not be one dagrl has."""
    from dagrl.config.swift_keys import DEFERRED

    schema = keys.schema_keys()
    open_dicts = [k for k, info in schema.items() if info.open]
    for key, rule in compat.TABLE.items():
        assert key not in DEFERRED, key  # resolved after composition (dagrl/config/swift_keys.py)
        if isinstance(rule, compat.Alias):
            assert (
                rule.target in schema
                or rule.target in keys.sections()
                or any(rule.target.startswith(k + ".") for k in open_dicts)
            ), key
        else:
            assert key not in schema and key not in keys.sections(), key


def test_verl_config_name_picks_megatron():
    action, overrides = parse_args(
        ["--config-path=config", "--config-name", "ppo_megatron_trainer.yaml", "x=1"]
    )
    assert action is None and overrides == ["actor_rollout_ref.actor.strategy=megatron", "x=1"]
    with pytest.raises(ConfigError, match="--config-name"):
        parse_args(["--config-name=my_own"])


def test_cli_typo_with_plus_is_one_dagrl_line(tmp_path):
    proc = run_cli("+data.train_batch_sizee=4", "trainer.dry_run=true", tmp_path=tmp_path)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, out
    assert out == (
        "error: config key 'data.train_batch_sizee' = 4: unknown key; did you mean 'data.train_batch_size'?"
    )


def test_cli_unknown_key_has_no_hydra_hint(capsys):
    code, out = main_in_process(capsys, "trainer.max_critic_ckpt_to_keep=1")
    out = out.strip()
    assert code == 2 and len(out.splitlines()) == 1, out
    assert "+" not in out and "Traceback" not in out and "OmegaConf" not in out


def test_help_lists_groups_and_every_key_with_type_default_and_meaning(capsys):
    code, out = main_in_process(capsys, "--help")
    assert code == 0, out
    assert (
        "algorithm=dapo|dr_grpo|gkd|grpo|gspo|opsd|ppo|reinforce_plus_plus|rloo|sft" in out
        and "placement=colocate|separate" in out
    )
    for key, info in keys.schema_keys().items():
        assert f"  {key}  ({info.type}, default " in out, key
        assert info.doc and info.doc in out, key
    assert "  trainer.total_training_steps  (int|null, default null)" in out


def test_cfg_job_is_resolved_and_hydra_writes_no_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # where Hydra's own main would write outputs/<date>/<time>/
    code, out = main_in_process(capsys, "--cfg", "job", "trainer.project_name=p")
    assert code == 0, out
    assert "${" not in out
    assert "default_local_dir: checkpoints/p/default" in out
    assert os.listdir(tmp_path) == []  # no outputs/<date>/<time>/ folder


def test_help_text_groups_come_from_the_conf_dir():
    assert keys.config_groups(CONF_DIR)["placement"] == ["colocate", "separate"]


def test_docs_table_lists_every_entry():
    text = (REPO / "docs" / "compat.md").read_text()
    assert [key for key in compat.TABLE if f"| `{key}" not in text] == []


def test_verl_custom_reward_function_makes_one_reward_term():
    """verl's custom_reward_function.{path,name,reward_kwargs}: the file joins external_plugins (after
    the given entries), the function is a reward term with the kwargs (verl's default name is
    compute_score)."""
    cfg = typed(
        "external_plugins=[my_pkg.rewards]",
        "custom_reward_function.path=/data/my_reward.py",
        "custom_reward_function.name=my_score",
        "+custom_reward_function.reward_kwargs.format_score=0.1",
        "custom_reward_function.reward_kwargs.method=strict",
    )
    assert cfg.external_plugins == ["my_pkg.rewards", "/data/my_reward.py"]
    [term] = cfg.reward.functions
    assert (term.name, term.weight, term.kwargs) == (
        "my_score",
        1.0,
        {"format_score": 0.1, "method": "strict"},
    )
    [term] = typed("custom_reward_function.path=/data/my_reward.py").reward.functions
    assert (term.name, term.kwargs) == ("compute_score", {})
    assert typed("custom_reward_function.path=null").reward.functions == []  # verl's: no custom reward


def test_verl_custom_reward_function_refusals_name_the_key():
    with pytest.raises(ConfigError) as info:
        typed("custom_reward_function.path=/data/r.py", "custom_reward_function.nme=f")
    assert (
        info.value.key == "custom_reward_function.nme"
        and "did you mean custom_reward_function.name" in str(info.value)
    )
    with pytest.raises(ConfigError, match="reward.functions is given too"):
        typed("custom_reward_function.path=/data/r.py", "reward.functions=[{name: gsm8k}]")
