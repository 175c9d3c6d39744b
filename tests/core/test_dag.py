"""DAG loading and validation: the shipped GRPO DAG, pruning by config, and every rejected shape."""

from __future__ import annotations

import textwrap

import pytest

from dagrl.core.dag import Dag, build_dag, load_dag_specs, prune_disabled
from dagrl.errors import DagError
from tests.conftest import compose_config

POOLS = {"train", "rollout", "ref"}
SOURCE = "source: [prompts, prompt_mask, group_ids, data_source, ground_truth, extra_info]\n"


def shipped_grpo(*overrides: str) -> Dag:
    cfg = compose_config(*overrides)
    source, specs = load_dag_specs(cfg.dag)
    return build_dag(cfg.dag, source, prune_disabled(specs, cfg), POOLS)


def build_yaml(tmp_path, body: str, pools: set[str] = POOLS) -> Dag:
    path = tmp_path / "dag.yaml"
    path.write_text(SOURCE + textwrap.dedent(body))
    source, specs = load_dag_specs(str(path))
    return build_dag(str(path), source, specs, pools)


def position(dag: Dag, name: str) -> int:
    return [n.name for n in dag.nodes].index(name)


def test_shipped_grpo_with_kl_loss():
    # the separate old-log-prob pass pinned on (auto skips it on-policy: test_memory_plan.py)
    dag = shipped_grpo(
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.recompute_old_logprobs=true"
    )
    names = [n.name for n in dag.nodes]
    assert set(names) == {
        "weight_sync",
        "rollout",
        "reward",
        "old_logprob",
        "ref_logprob",
        "advantage",
        "actor_update",
    }
    assert position(dag, "weight_sync") < position(dag, "rollout")
    assert names[-1] == "actor_update"
    # the advantage waits for the score; the old log-probs only reach it through KL in the reward
    assert "reward" in dag.deps["advantage"] and "old_logprob" in dag.deps["actor_update"]
    assert dag.deps["rollout"] == {"weight_sync"}
    assert dag.deps["reward"] == {"rollout"}
    assert dag.deps["actor_update"] >= {"ref_logprob", "old_logprob", "advantage", "rollout"}
    assert "ref_logprobs" in dag.node("actor_update").inputs
    assert dag.roles() == {"train", "rollout", "ref"}


def test_shipped_grpo_without_kl_prunes_ref():
    dag = shipped_grpo("actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=false")
    names = [n.name for n in dag.nodes]
    assert "ref_logprob" not in names
    assert "ref_logprobs" not in dag.node("actor_update").inputs
    assert "ref_logprobs" not in dag.node("advantage").inputs
    assert "ref_logprob" not in dag.deps["actor_update"]
    assert dag.roles() == {"train", "rollout"}
    # a ref pool is not needed when nothing runs on it
    cfg = compose_config()
    source, specs = load_dag_specs(cfg.dag)
    build_dag(cfg.dag, source, prune_disabled(specs, cfg), {"train", "rollout"})


def test_kl_in_reward_keeps_ref():
    dag = shipped_grpo("algorithm.use_kl_in_reward=true")
    assert "ref_logprob" in [n.name for n in dag.nodes]


def test_dag_name_may_be_a_path(tmp_path):
    dag = build_yaml(
        tmp_path,
        """
        nodes:
          rollout:
            kind: rollout
            role: rollout
            inputs: [prompts, prompt_mask]
            outputs: [responses, response_mask, rollout_logprobs]
    """,
    )
    assert [n.name for n in dag.nodes] == ["rollout"]
    assert dag.source[0] == "prompts"


def test_unknown_dag_name_lists_available():
    with pytest.raises(DagError, match=r"dag='grop'.*\[.*'grpo'"):
        load_dag_specs("grop")


def test_unknown_kind_lists_known(tmp_path):
    with pytest.raises(DagError, match="unknown kind 'rollot'") as info:
        build_yaml(
            tmp_path,
            """
            nodes:
              gen:
                kind: rollot
                role: rollout
        """,
        )
    assert "'rollout'" in str(info.value) and "'advantage'" in str(info.value)
    assert "register_node_kind" in str(info.value)


def test_cycle(tmp_path):
    with pytest.raises(DagError, match=r"cycle among nodes \['sync_a', 'sync_b'\]"):
        build_yaml(
            tmp_path,
            """
            nodes:
              sync_a:
                kind: weight_sync
                role: rollout
                after: [sync_b]
              sync_b:
                kind: weight_sync
                role: rollout
                after: [sync_a]
        """,
        )


def test_input_nobody_produces(tmp_path):
    with pytest.raises(DagError, match=r"node 'reward' reads \['responses', 'response_mask'\]"):
        build_yaml(
            tmp_path,
            """
            nodes:
              reward:
                kind: reward
                inputs: [responses, response_mask, data_source, ground_truth, extra_info]
                outputs: [scores]
        """,
        )


def test_key_produced_twice(tmp_path):
    with pytest.raises(DagError, match=r"key 'old_logprobs' is produced twice \(by old_a and old_b\)"):
        build_yaml(
            tmp_path,
            """
            nodes:
              rollout:
                kind: rollout
                role: rollout
                inputs: [prompts, prompt_mask]
                outputs: [responses, response_mask, rollout_logprobs]
              old_a:
                kind: old_logprob
                role: train
                inputs: [prompts, prompt_mask, responses, response_mask]
                outputs: [old_logprobs]
              old_b:
                kind: old_logprob
                role: train
                inputs: [prompts, prompt_mask, responses, response_mask]
                outputs: [old_logprobs]
        """,
        )


def test_remote_kind_without_role(tmp_path):
    with pytest.raises(DagError, match="kind weight_sync runs on a worker pool; give it a 'role'"):
        build_yaml(
            tmp_path,
            """
            nodes:
              sync:
                kind: weight_sync
        """,
        )


def test_driver_kind_with_role(tmp_path):
    with pytest.raises(DagError, match="kind advantage runs on the driver; remove its 'role'"):
        build_yaml(
            tmp_path,
            """
            nodes:
              advantage:
                kind: advantage
                role: train
                inputs: [scores, group_ids, response_mask]
        """,
        )


def test_role_without_pool(tmp_path):
    with pytest.raises(
        DagError, match=r"role 'teacher' has no worker pool; roles with pools: \['rollout', 'train'\]"
    ):
        build_yaml(
            tmp_path,
            """
            nodes:
              sync:
                kind: weight_sync
                role: teacher
        """,
            pools={"train", "rollout"},
        )


def test_undeclared_batch_key(tmp_path):
    with pytest.raises(DagError, match="undeclared batch key 'prompt_ids'"):
        build_yaml(
            tmp_path,
            """
            nodes:
              rollout:
                kind: rollout
                role: rollout
                inputs: [prompt_ids, prompt_mask]
                outputs: [responses, response_mask, rollout_logprobs]
        """,
        )


def test_kind_missing_required_input(tmp_path):
    with pytest.raises(DagError, match=r"kind rollout needs inputs \['prompt_mask'\]"):
        build_yaml(
            tmp_path,
            """
            nodes:
              rollout:
                kind: rollout
                role: rollout
                inputs: [prompts]
                outputs: [responses, response_mask, rollout_logprobs]
        """,
        )


def test_unknown_field_in_node(tmp_path):
    with pytest.raises(DagError, match=r"node 'rollout' needs 'kind' and may only have.*'rol'"):
        build_yaml(
            tmp_path,
            """
            nodes:
              rollout:
                kind: rollout
                rol: rollout
                inputs: [prompts, prompt_mask]
        """,
        )


def test_kind_given_a_key_it_does_not_read_or_produce(tmp_path):
    # a declared batch key, in the wrong node: the rollout neither reads nor writes advantages
    with pytest.raises(DagError, match=r"kind rollout does not read \[\] / produce \['advantages'\]"):
        build_yaml(
            tmp_path,
            """
            nodes:
              rollout:
                kind: rollout
                role: rollout
                inputs: [prompts, prompt_mask]
                outputs: [responses, response_mask, rollout_logprobs, advantages]
        """,
        )


def test_unknown_top_level_key_in_a_dag_file(tmp_path):
    # 'node' for 'nodes': refused naming what it got, not read as a DAG without nodes
    with pytest.raises(DagError, match=r"'source', 'nodes' and 'sinks' only \(got \['node', 'source'\]\)"):
        build_yaml(tmp_path, "node:\n  rollout: {kind: rollout, role: rollout}\n")


def test_a_dag_file_that_is_not_yaml_names_the_line(tmp_path):
    # line 1 is SOURCE; the stray colon of line 5 stands in column 11 (both counted from 1)
    with pytest.raises(DagError, match=r"dag.yaml: not valid YAML at line 5, column 11 \(mapping values"):
        build_yaml(tmp_path, "nodes:\n  rollout:\n    kind: rollout\n    role: : rollout\n")


def edited_grpo(tmp_path, drop_node: str, drop_inputs: dict[str, str] | None = None) -> str:
    """The shipped GRPO DAG without one node, and without the inputs {node: key} named."""
    import yaml

    from dagrl.core.dag import dag_path

    with open(dag_path("grpo")) as f:
        raw = yaml.safe_load(f)
    del raw["nodes"][drop_node]
    for node, key in (drop_inputs or {}).items():
        raw["nodes"][node]["inputs"].remove(key)
    path = tmp_path / "dag.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def build_for(path: str, *overrides: str) -> Dag:
    cfg = compose_config(*overrides)
    source, specs = load_dag_specs(path)
    return build_dag(path, source, prune_disabled(specs, cfg), POOLS)


def test_objective_inputs_need_a_producer(tmp_path):
    # the update reads ref_logprobs only with the KL loss: then a DAG without the ref node fails
    no_ref = {"kl_in_reward": "ref_logprobs", "actor_update": "ref_logprobs"}
    path = edited_grpo(tmp_path, "ref_logprob", no_ref)
    build_for(path)
    with pytest.raises(DagError, match=r"kind actor_update needs inputs \['ref_logprobs'\]"):
        build_for(path, "actor_rollout_ref.actor.use_kl_loss=true")
    path = edited_grpo(tmp_path, "ref_logprob", {"kl_in_reward": "ref_logprobs"})
    with pytest.raises(
        DagError, match=r"node 'actor_update' reads \['ref_logprobs'\], which no node produces"
    ):
        build_for(path, "actor_rollout_ref.actor.use_kl_loss=true")


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo", "gspo"])
def test_advantages_need_a_producer(tmp_path, algorithm):
    from dagrl.core.dag import dag_path

    build_for(dag_path("grpo"), f"algorithm={algorithm}")
    path = edited_grpo(tmp_path, "advantage")
    with pytest.raises(DagError, match=r"node 'actor_update' reads \['advantages'\]"):
        build_for(path, f"algorithm={algorithm}")


def test_kl_in_reward_requires_the_log_probs_at_its_node(tmp_path):
    path = edited_grpo(tmp_path, "ref_logprob", {"actor_update": "ref_logprobs"})
    with pytest.raises(DagError, match=r"node 'kl_in_reward' reads \['ref_logprobs'\]"):
        build_for(path, "algorithm.use_kl_in_reward=true")
    path = edited_grpo(
        tmp_path, "ref_logprob", {"actor_update": "ref_logprobs", "kl_in_reward": "ref_logprobs"}
    )
    build_for(path)  # without KL in the reward its node is not in the DAG
    with pytest.raises(DagError, match=r"kind kl_in_reward needs inputs \['ref_logprobs'\]"):
        build_for(path, "algorithm.use_kl_in_reward=true")
    # the advantage node sums the term in: a DAG without the node making it is refused
    path = edited_grpo(tmp_path, "kl_in_reward", {"advantage": "kl_rewards"})
    build_for(path)
    with pytest.raises(DagError, match=r"kind advantage needs inputs \['kl_rewards'\]"):
        build_for(path, "algorithm.use_kl_in_reward=true")


def test_built_dag_is_immutable_and_pickles():
    import pickle

    source, specs = load_dag_specs("grpo")
    dag = build_dag("grpo", source, prune_disabled(specs, compose_config()), {"train", "rollout"})
    with pytest.raises(TypeError):
        dag.deps["advantage"] = frozenset()  # frozen means frozen: deps cannot be edited either
    again = pickle.loads(pickle.dumps(dag))
    assert again == dag and again.deps["reward"] == {"rollout"}


def test_a_producer_nothing_reads_is_pruned_with_what_only_it_read():
    from dagrl.core.dag import prune_unconsumed
    from dagrl.core.node import NodeSpec

    specs = [
        NodeSpec("teacher", "teacher_logprob", "teacher", ["responses"], ["teacher_logprobs"]),
        NodeSpec("term", "distill_reward", None, ["teacher_logprobs"], ["distill_advantages"]),
        NodeSpec("reward", "reward", None, ["responses"], ["scores"]),
        NodeSpec("sync", "weight_sync", "rollout", [], [], ["reward"]),  # waits for it: stays
        NodeSpec("update", "actor_update", "train", ["responses"]),  # no outputs: acts by running
    ]
    kept = [s.name for s in prune_unconsumed(specs, [])]
    assert kept == ["reward", "sync", "update"]  # the term, then the teacher only it read
    assert [s.name for s in prune_unconsumed(specs, ["distill_advantages"])] == [s.name for s in specs]
    assert prune_unconsumed(specs, None) == specs  # a DAG file without sinks: every node stays


def test_the_dag_sinks_keep_what_the_trainer_reads(tmp_path):
    """GKD's reward is logged, not trained on: `sinks: [scores]` keeps it; with no sink the node
    does work no one sees and is pruned before the plan. A file without `sinks` prunes nothing."""
    import yaml

    from dagrl.core.dag import dag_path, load_dag_file, prune_unconsumed
    from dagrl.trainer.setup import prepare

    shipped = load_dag_file("gkd")
    specs = prune_disabled(shipped.specs, compose_config("algorithm=gkd"))
    assert "reward" in {s.kind for s in prune_unconsumed(specs, shipped.sinks)}
    with open(dag_path("gkd")) as f:
        raw = yaml.safe_load(f)
    raw["sinks"] = []
    path = tmp_path / "gkd_no_sinks.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = compose_config("algorithm=gkd", f"dag={path}", "trainer.dry_run=true")  # as a run plans it
    assert "reward" not in {n.kind for n in prepare(cfg).dag.nodes}
    del raw["sinks"]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert load_dag_file(str(path)).sinks is None
    raw["sinks"] = ["scorez"]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(DagError, match=r"sinks \['scorez'\] are not declared batch keys"):
        load_dag_file(str(path))
