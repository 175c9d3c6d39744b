"""Every command README.md and docs/*.md show, every shipped preset (algorithm=, experiment=,
placement=, pipeline=, each DAG under conf/dags/) and every documented mode of a key with several
(`teacher.model=<path or self or self_current>`) has a test that runs it: a new one cannot land
untested. Commands: tests/e2e/test_documented_commands.py runs the CPU ones from outside the
checkout, plans every GPU one (any documented command not mapped elsewhere) with
trainer.dry_run=true, and names the tests that run the others (ELSEWHERE)."""

from __future__ import annotations

import ast
import re
from functools import cache

from tests.docs.commands import ROOT, commands_in, documented_commands, documented_files
from tests.e2e.test_documented_commands import CPU_COMMANDS, ELSEWHERE

CPU_RUN = "tests/e2e/test_documented_commands.py::test_cpu_command_runs_from_any_directory"
E2E = "tests/e2e/"

# each preset group value and each DAG under conf/dags -> a test that runs it (GPU-only: plans it)
PRESETS = {
    "algorithm=grpo": E2E + "test_grpo_run.py::test_resume_reproduces_uninterrupted_run",
    "algorithm=dr_grpo": E2E + "test_algorithms_run.py::test_dr_grpo_learns",
    "algorithm=gspo": E2E + "test_algorithms_run.py::test_gspo_learns",
    "algorithm=gkd": E2E + "test_gkd_run.py::test_gkd_resume_reproduces_uninterrupted_run",
    "algorithm=opsd": E2E + "test_opsd_run.py::test_opsd_resume_reproduces_uninterrupted_run",
    "algorithm=sft": E2E + "test_sft_run.py::test_sft_from_scratch_lowers_validation_loss_across_a_resume",
    "algorithm=dapo": E2E + "test_dapo_run.py::test_dapo_refills_the_batch",
    "algorithm=rloo": E2E + "test_algorithms_run.py::test_estimator_preset_runs_a_step",
    "algorithm=reinforce_plus_plus": E2E + "test_algorithms_run.py::test_estimator_preset_runs_a_step",
    "algorithm=ppo": E2E + "test_ppo_run.py::test_ppo_resume_reproduces_uninterrupted_run_critic_included",
    "placement=colocate": E2E + "test_grpo_run.py::test_resume_reproduces_uninterrupted_run",
    "placement=separate": E2E + "test_grpo_run.py::test_separate_rollout_pool_receives_weights_through_ray",
    "pipeline=sample": E2E + "test_sample_run.py::test_sample_kill_resume_in_device_groups_then_sft",
    "experiment=multi_turn/calculator": CPU_RUN,
    "experiment=multi_turn/python_math": (
        "tests/config/test_multi_turn_config.py::test_python_math_preset_plans_a_vllm_run_on_gsm8k"
    ),
    "experiment=gkd/rollout_colocate_teacher_colocate": (
        "tests/config/test_teacher_standalone.py::test_each_preset_dry_runs_on_a_declared_gpu_cluster"
    ),
    "experiment=gkd/rollout_separate_teacher_colocate": (
        "tests/config/test_teacher_standalone.py::test_each_preset_dry_runs_on_a_declared_gpu_cluster"
    ),
    "experiment=gkd/rollout_colocate_teacher_standalone": (
        "tests/config/test_teacher_standalone.py::test_each_preset_dry_runs_on_a_declared_gpu_cluster"
    ),
    "experiment=gkd/opsd_plugin_teacher_standalone": (
        "tests/plugins/test_opsd_plugin.py::test_opsd_preset_feeds_teacher_prompts_to_the_standalone_teacher"
    ),
    "dag=grpo": E2E + "test_grpo_run.py::test_resume_reproduces_uninterrupted_run",
    "dag=validate": E2E + "test_grpo_run.py::test_default_run_learns",
    "dag=gkd": E2E + "test_gkd_run.py::test_gkd_resume_reproduces_uninterrupted_run",
    "dag=opsd": E2E + "test_opsd_run.py::test_opsd_resume_reproduces_uninterrupted_run",
    "dag=sft": E2E + "test_sft_run.py::test_sft_from_scratch_lowers_validation_loss_across_a_resume",
    "dag=sft_validate": E2E + "test_sft_run.py::test_sft_from_scratch_lowers_validation_loss_across_a_resume",
    "dag=sample": E2E + "test_sample_run.py::test_sample_kill_resume_in_device_groups_then_sft",
    "dag=ppo": E2E + "test_ppo_run.py::test_ppo_resume_reproduces_uninterrupted_run_critic_included",
    "dag=ppo_multi_turn": E2E + "test_ppo_run.py::test_ppo_over_multi_turn_episodes_credits_each_turn",
    "dag=grpo_multi_turn": E2E
    + "test_multi_turn_run.py::test_multi_turn_resume_reproduces_uninterrupted_run",
    "dag=validate_multi_turn": CPU_RUN,
    "dag=gkd_multi_turn": E2E + "test_multi_turn_distill_run.py::test_distillation_over_multi_turn_episodes",
    "dag=opsd_multi_turn": E2E + "test_multi_turn_distill_run.py::test_distillation_over_multi_turn_episodes",
}

# each documented value of a key with several modes -> a test that runs it
MODES = {
    "teacher.model=self": CPU_RUN,
    "teacher.model=self_current": E2E
    + "test_opsd_run.py::test_self_current_teacher_runs_on_the_train_workers",
    "teacher.model=<path>": E2E + "test_gkd_run.py::test_gkd_resume_reproduces_uninterrupted_run",
    "algorithm=grpo": PRESETS["algorithm=grpo"],
    "algorithm=gkd": PRESETS["algorithm=gkd"],
    "sample.filter=best_of_n": PRESETS["pipeline=sample"],
    "sample.filter=threshold": "tests/sample/test_sample_parts.py::test_filters",
    "sample.filter=keep_all": "tests/sample/test_sample_parts.py::test_filters",
    "algorithm.adv_estimator=rloo": E2E + "test_algorithms_run.py::test_estimator_preset_runs_a_step",
    "algorithm.adv_estimator=reinforce_plus_plus": E2E
    + "test_algorithms_run.py::test_estimator_preset_runs_a_step",
    "algorithm.adv_estimator=reinforce_plus_plus_baseline": E2E
    + "test_algorithms_run.py::test_estimator_preset_runs_a_step",
    "algorithm.adv_estimator=gae": E2E
    + "test_ppo_run.py::test_ppo_resume_reproduces_uninterrupted_run_critic_included",
    "algorithm.rollout_correction.rollout_is=token": (
        E2E + "test_rollout_overlap.py::test_on_policy_update_skips_the_old_logprob_pass"
    ),
    "algorithm.rollout_correction.rollout_is=sequence": (
        "tests/algos/test_rollout_correction.py::test_sequence_weights_are_the_product_per_row"
    ),
}


# each launch script and preprocessing script -> a test that runs it (on a small local fixture)
SCRIPTS = {
    "run_scripts/run_qwen3-8b-megatron.sh": "tests/config/test_megatron_config.py::test_script_dry_run_plans_tp2_pp4",
    "run_scripts/run_qwen3-0.6b-vllm.sh": (
        "tests/e2e/test_documented_commands.py::test_vllm_script_plans_from_any_directory"
    ),
    "run_scripts/gkd/run.sh": "tests/config/test_config_file.py::test_run_sh_runs_the_users_file_not_the_preset_of_that_name",
    "examples/data_preprocess/gsm8k.py": "tests/data_preprocess/test_scripts.py::test_gsm8k_skips_bad_rows_and_reports_them",
    "examples/data_preprocess/math_dataset.py": "tests/data_preprocess/test_scripts.py::test_math_answers_and_report",
    "examples/data_preprocess/deepscaler.py": "tests/data_preprocess/test_scripts.py::test_deepscaler_holdout_and_answers",
    "examples/data_preprocess/builtin_arith.py": "tests/data_preprocess/test_scripts.py::test_builtin_arith_export",
}


@cache
def _functions(path: str) -> set[str]:
    return {n.name for n in ast.walk(ast.parse((ROOT / path).read_text())) if isinstance(n, ast.FunctionDef)}


def missing_tests(registry: dict[str, str]) -> list[str]:
    """Entries whose test id names no test function in an existing file."""
    out = []
    for what, test_id in registry.items():
        path, _, name = test_id.partition("::")
        if not (ROOT / path).is_file() or name not in _functions(path):
            out.append(f"{what}: {test_id} does not exist")
    return out


def documented_modes(text: str) -> set[str]:
    """`key=<path or a or b>` and `key=a|b|c` in backticks: each alternative as `key=value`."""
    modes = set()
    for key, alternatives in re.findall(r"`[^`]*?\b([a-z_][\w.]*)=<([^>]+ or [^>]+)>", text):
        modes |= {f"{key}=<{a}>" if a == "path" else f"{key}={a}" for a in alternatives.split(" or ")}
    for key, alternatives in re.findall(r"`([a-z_][\w.]*)=(\w+(?:\|\w+)+)`", text):
        modes |= {f"{key}={a}" for a in alternatives.split("|")}
    return modes


def shipped_presets() -> set[str]:
    conf = ROOT / "dagrl" / "conf"
    found = {f"dag={p.stem}" for p in (conf / "dags").glob("*.yaml")}
    for group in ("algorithm", "experiment", "placement", "pipeline"):
        found |= {
            f"{group}={p.relative_to(conf / group).with_suffix('')}" for p in (conf / group).rglob("*.yaml")
        }
    return found


def test_the_scan_reads_fenced_multi_line_and_inline_commands():
    text = (
        "Run `python -m dagrl.main algorithm=gkd` or:\n```bash\nFOO=1 python -m dagrl.main \\\n"
        "  a=1 \\\n  b=2   # two keys\nbash run_scripts/gkd/run.sh x.yaml\n```\n"
    )
    assert commands_in(text) == [
        "python -m dagrl.main algorithm=gkd",
        "python -m dagrl.main a=1 b=2",
        "bash run_scripts/gkd/run.sh x.yaml",
    ]
    assert documented_modes("`t.m=<path or self>` and `s.f=a|b`") == {
        "t.m=<path>",
        "t.m=self",
        "s.f=a",
        "s.f=b",
    }


def test_commands_mapped_to_tests_are_documented_and_the_tests_exist():
    """A documented command is run here (CPU_COMMANDS), by the test ELSEWHERE names, or planned as a
    GPU command (test_gpu_command_plans): stale entries and ids that name no test fail."""
    documented = documented_commands()
    assert len(documented) >= 15 and "python -m dagrl.main experiment=multi_turn/calculator" in documented
    stale = [c for c in (*CPU_COMMANDS, *ELSEWHERE) if c not in documented]
    # CPU_COMMANDS may hold a documented mode (teacher.model=self) the docs show as a table row
    stale = [c for c in stale if c not in CPU_COMMANDS or not c.endswith(tuple(MODES))]
    assert not stale, f"no longer documented: {stale}"
    assert not missing_tests(ELSEWHERE)


def test_every_shipped_preset_and_dag_has_a_test_that_runs_it():
    assert shipped_presets() == set(PRESETS), (
        f"presets without a test: {sorted(shipped_presets() - set(PRESETS))}; "
        f"gone: {sorted(set(PRESETS) - shipped_presets())}"
    )
    assert not missing_tests(PRESETS)


def test_every_script_has_a_test_that_runs_it():
    scripts = {str(p.relative_to(ROOT)) for p in (ROOT / "run_scripts").rglob("*.sh")}
    scripts |= {
        str(p.relative_to(ROOT))
        for p in (ROOT / "examples" / "data_preprocess").glob("*.py")
        if p.stem != "common"
    }
    assert scripts == set(SCRIPTS), f"without a test: {sorted(scripts - set(SCRIPTS))}"
    assert not missing_tests(SCRIPTS)


def test_every_documented_mode_has_a_test_that_runs_it():
    modes = set().union(*(documented_modes(p.read_text()) for p in documented_files()))
    assert "teacher.model=self_current" in modes
    assert modes <= set(MODES), f"documented modes without a test: {sorted(modes - set(MODES))}"
    assert not missing_tests(MODES)


def test_the_checkpoints_kept_are_documented_as_the_code_keeps_them():
    """README and docs/compat.md state trainer.max_actor_ckpt_to_keep's default and its ms-swift and
    verl counterparts as the schema and the compatibility table have them."""
    from dagrl.config import compat, keys

    default = keys.schema_keys()["trainer.max_actor_ckpt_to_keep"].default
    readme = (ROOT / "README.md").read_text()
    compat_md = (ROOT / "docs" / "compat.md").read_text()
    assert f"`trainer.max_actor_ckpt_to_keep` (default {default})" in readme
    assert f"the newest {default} by default" in readme
    assert (
        f"`trainer.max_actor_ckpt_to_keep` is {default}, where verl's null keeps every checkpoint"
        in compat_md
    )
    assert compat.TABLE["save_total_limit"].target == "trainer.max_actor_ckpt_to_keep"
    assert "| `save_total_limit` | same concept | `trainer.max_actor_ckpt_to_keep` |" in compat_md
    assert "max_actor_ckpt_to_keep keeps both" in compat.TABLE["trainer.max_critic_ckpt_to_keep"].fix
