"""algorithm=opsd and the distillation options around it: the teacher reading its privileged
prompt (aligned with the student's response grid), the student as its own teacher (`self`,
`self_current`), off-policy steps and the SFT term on dataset responses (lmbda, sft_alpha)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dagrl.algos import LossAggMode, agg_loss
from dagrl.algos.distillation import topk_divergence
from dagrl.config.role_specs import build_role_specs
from dagrl.config.roles import role_aliases
from dagrl.config.validate import resolve_defaults, validate
from dagrl.core.batch import Batch, left_pad
from dagrl.core.dag import build_dag, load_dag_specs, prune_disabled
from dagrl.data.builtin import tiny_teacher_path
from dagrl.errors import ConfigError
from dagrl.nodes.rollout import RolloutNode, is_off_policy_step
from dagrl.nodes.teacher import with_teacher_prompts
from dagrl.objectives import build_objective
from tests.conftest import compose_config
from tests.objectives.test_gkd import _backend, _response_logits

G = "algorithm.gkd"


def opsd_config(*overrides: str):
    cfg = compose_config("algorithm=opsd", *overrides)
    resolve_defaults(cfg)
    return cfg


def test_default_opsd_job_uses_the_shipped_teacher_and_the_privileged_prompts():
    cfg = opsd_config()
    validate(cfg)
    assert cfg.teacher.model == tiny_teacher_path() and cfg.dag == "opsd"
    source, specs = load_dag_specs(cfg.dag)
    dag = build_dag(cfg.dag, source, prune_disabled(specs, cfg), {"train", "rollout", "teacher"})
    assert {"teacher_prompts", "teacher_prompt_mask"} <= set(
        dag.node("teacher_hidden").inputs
    )  # full vocabulary


def test_teacher_scores_the_same_response_ids_after_its_own_prompt():
    """Privileged prompts of other lengths than the student's: the teacher's top-k on the [B, R]
    grid equals each row scored alone as teacher_prompt + response."""
    cfg = opsd_config(f"{G}.gkd_logits_topk=6")
    teacher = _backend(cfg, forward_only=True)
    g = torch.Generator().manual_seed(1)
    student_prompts = [torch.randint(5, 261, (n,), generator=g).tolist() for n in (4, 2, 3)]
    teacher_prompts = [torch.randint(5, 261, (n,), generator=g).tolist() for n in (9, 3, 6)]
    responses = torch.randint(5, 261, (3, 4), generator=g)
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    batch = Batch(
        dict(
            zip(("prompts", "prompt_mask"), left_pad(student_prompts, 0)),
            **dict(zip(("teacher_prompts", "teacher_prompt_mask"), left_pad(teacher_prompts, 0))),
            responses=responses,
            response_mask=response_mask,
        )
    )
    out, _ = teacher.teacher_topk(with_teacher_prompts(batch), k=6, temperature=1.0)
    for row in range(3):
        alone = Batch(
            {
                "prompts": torch.tensor([teacher_prompts[row]]),
                "prompt_mask": torch.ones(1, len(teacher_prompts[row]), dtype=torch.long),
                "responses": responses[row : row + 1],
                "response_mask": response_mask[row : row + 1],
            }
        )
        with torch.no_grad():
            logprobs = torch.log_softmax(_response_logits(teacher.model, alone), -1)[0]
        real = response_mask[row].bool()
        top = logprobs.topk(6, -1)
        torch.testing.assert_close(
            out["teacher_topk_logprobs"][row][real], top.values[real], atol=1e-5, rtol=1e-5
        )
    # and not what it says after the student's prompt
    plain, _ = teacher.teacher_topk(
        with_teacher_prompts(batch.select(["prompts", "prompt_mask", "responses", "response_mask"])),
        k=6,
        temperature=1.0,
    )
    assert not torch.allclose(plain["teacher_topk_logprobs"], out["teacher_topk_logprobs"])


def test_self_teacher_is_a_frozen_copy_of_the_student_and_self_current_the_train_role():
    frozen = opsd_config("teacher.model=self")
    validate(frozen)
    specs = build_role_specs(frozen, {"train", "teacher"})
    assert specs["teacher"].model.path == specs["train"].model.path  # the student's initial weights
    assert not specs["teacher"].trains and role_aliases(frozen) == {}

    with pytest.raises(ConfigError, match="gkd_logits_topk"):
        validate(opsd_config("teacher.model=self_current"))  # full vocabulary: refused
    current = opsd_config("teacher.model=self_current", f"{G}.gkd_logits_topk=16")
    validate(current)
    assert role_aliases(current) == {"teacher": "train"}
    source, node_specs = load_dag_specs(current.dag)
    dag = build_dag(current.dag, source, prune_disabled(node_specs, current), {"train", "rollout"})
    assert dag.node("teacher_logprob").role == "train" and "teacher" not in dag.roles()


def test_self_teacher_of_the_shipped_student_gives_zero_divergence_at_the_start():
    cfg = opsd_config("teacher.model=self", f"{G}.gkd_logits_topk=261")
    student, teacher = _backend(cfg, forward_only=False), _backend(cfg, forward_only=True)
    g = torch.Generator().manual_seed(0)
    ids, mask = left_pad([torch.randint(5, 261, (n,), generator=g).tolist() for n in (3, 5)], 0)
    batch = Batch(
        {
            "prompts": ids,
            "prompt_mask": mask,
            "responses": torch.randint(5, 261, (2, 3), generator=g),
            "response_mask": torch.ones(2, 3, dtype=torch.long),
        }
    )
    top, _ = teacher.teacher_topk(batch, k=261, temperature=1.0)
    batch = batch.union(top)
    objective = build_objective(cfg)
    loss, _ = objective.loss(batch, student._token_outputs(student.model, batch, objective.request))
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-6)


def test_off_policy_steps_are_seeded_by_the_step_and_about_one_minus_lmbda():
    draws = [is_off_policy_step(7, step, 0.75) for step in range(1, 2001)]
    assert draws == [is_off_policy_step(7, step, 0.75) for step in range(1, 2001)]  # reproducible
    assert 0.22 < sum(draws) / len(draws) < 0.28
    assert not any(is_off_policy_step(7, step, 1.0) for step in range(1, 200))
    assert all(is_off_policy_step(7, step, 0.0) for step in range(1, 200))


def test_rollout_node_passes_the_dataset_responses_on_an_off_policy_step():
    from dagrl.core.node import NodeSpec

    cfg = opsd_config(f"{G}.lmbda=0.0")
    spec = NodeSpec(
        "rollout",
        "rollout",
        "rollout",
        ["prompts", "prompt_mask", "dataset_responses", "dataset_response_mask"],
        ["responses", "response_mask", "rollout_logprobs", "off_policy"],
    )
    responses = torch.tensor([[11, 12, 1, 0], [13, 1, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    batch = Batch(
        {
            "prompts": torch.ones(2, 3, dtype=torch.long),
            "prompt_mask": torch.ones(2, 3, dtype=torch.long),
            "dataset_responses": responses,
            "dataset_response_mask": mask,
        }
    )

    class NoRollout:  # an off-policy step must not sample
        cfg = type("C", (), {"trainer": type("T", (), {"seed": 1})})()
        step = 3

        def role(self, name):
            raise AssertionError("sampled on an off-policy step")

    result = RolloutNode(spec, cfg).run(NoRollout(), batch)
    assert torch.equal(result.batch["responses"], responses) and torch.equal(
        result.batch["response_mask"], mask
    )
    assert result.batch["off_policy"].tolist() == [1.0, 1.0]
    assert result.metrics["distill/off_policy_step"] == 1.0


def test_sft_term_is_the_nll_of_the_dataset_responses_on_off_policy_rows():
    cfg = opsd_config(f"{G}.lmbda=0.5", f"{G}.sft_alpha=0.3", f"{G}.gkd_logits_topk=8")
    student, teacher = _backend(cfg, forward_only=False), _backend(cfg, forward_only=True)
    g = torch.Generator().manual_seed(2)
    ids, mask = left_pad([torch.randint(5, 261, (n,), generator=g).tolist() for n in (3, 5, 4)], 0)
    response_mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    batch = Batch(
        {
            "prompts": ids,
            "prompt_mask": mask,
            "responses": torch.randint(5, 261, (3, 3), generator=g),
            "response_mask": response_mask,
        }
    )
    top, _ = teacher.teacher_topk(batch, k=8, temperature=1.0)
    objective = build_objective(cfg)
    assert "off_policy" in objective.required_keys and objective.request.logprobs
    for off in (0.0, 1.0):
        b = batch.union(top).union(Batch({"off_policy": torch.full((3,), off)}))
        loss, metrics = objective.loss(b, student._token_outputs(student.model, b, objective.request))
        with torch.no_grad():
            logits = _response_logits(student.model, b)
        logprobs = torch.log_softmax(logits, -1)
        m = response_mask.float()
        div = agg_loss(
            topk_divergence(
                logprobs.gather(-1, top["teacher_topk_ids"]), top["teacher_topk_logprobs"], m, 0.5
            ),
            m,
            LossAggMode.token_mean,
        )
        nll = -(logprobs.gather(-1, b["responses"][..., None])[..., 0] * m).sum() / m.sum()
        torch.testing.assert_close(loss.detach(), div + 0.3 * nll * off, rtol=1e-5, atol=1e-6)


def test_off_policy_needs_a_response_column_and_names_it(tmp_path):
    path = tmp_path / "train.parquet"
    row = {
        "data_source": "x",
        "prompt": [{"role": "user", "content": "1+1="}],
        "ability": "a",
        "reward_model": {"style": "rule", "ground_truth": "2"},
        "extra_info": {"answer": "2"},
    }
    pq.write_table(pa.Table.from_pylist([row]), path)
    data = [f"data.train_files={path}", f"data.val_files={path}"]
    with pytest.raises(ConfigError) as err:
        validate(opsd_config(*data, f"{G}.lmbda=0.5"))
    assert err.value.key == f"{G}.lmbda" and "'response'" in str(err.value)
    validate(opsd_config(*data, f"{G}.lmbda=0.5", "data.response_key=extra_info.answer"))  # the fix


def test_self_teacher_reads_the_students_output_layer():
    """`teacher.model=self` (full vocabulary): the update recomputes the teacher's logits with the
    output layer of the student's initial checkpoint; it was handed an empty path."""
    from dagrl.backends.hf_model import load_causal_lm, resolve_model_path
    from dagrl.backends.output_layer import load_output_layer, output_layer

    cfg = opsd_config("teacher.model=self")
    resolve_defaults(cfg)
    validate(cfg)
    path = build_objective(cfg).request.full_vocab.teacher_model
    student = resolve_model_path(cfg.actor_rollout_ref.model.path)
    assert path == student
    weight, bias = load_output_layer(path)
    expected, _ = output_layer(load_causal_lm(student, "float32", torch.device("cpu")))
    assert torch.equal(weight, expected.detach()) and bias is None
