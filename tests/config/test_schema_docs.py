"""Every config field of these sections has an attribute docstring (a later `--help` reads them)."""

from __future__ import annotations

import ast
import inspect

import pytest

import dagrl.config.schema as schema

DOCUMENTED = [
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "MegatronConfig",
    "SamplingConfig",
    "RefConfig",
    "PlacementConfig",
    "TrainerConfig",
    "TeacherConfig",
    "ActorConfig",
    "RolloutConfig",
    "VLLMEngineKwargs",
    "RolloutCorrectionConfig",
    "AlgorithmConfig",
    "KLCtrlConfig",
    "RewardTermConfig",
    "RewardConfig",
    "ActorRolloutRefConfig",
    "DagrlConfig",
    "GKDConfig",
    "DistillRewardConfig",
]


def field_docs(cls_name: str) -> dict[str, str | None]:
    tree = ast.parse(inspect.getsource(inspect.getmodule(getattr(schema, cls_name))))  # split by section
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    docs: dict[str, str | None] = {}
    for node, nxt in zip(cls.body, [*cls.body[1:], None]):
        if isinstance(node, ast.AnnAssign):
            is_doc = isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
            docs[node.target.id] = nxt.value.value if is_doc else None
    return docs


@pytest.mark.parametrize("cls_name", DOCUMENTED)
def test_every_field_has_a_docstring(cls_name):
    docs = field_docs(cls_name)
    assert docs, cls_name
    assert [name for name, doc in docs.items() if not doc] == []
