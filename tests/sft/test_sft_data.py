"""SFT's data path: multi-turn `messages` rows train on assistant tokens only; the objective's NLL."""

from __future__ import annotations

import pytest
import torch

from dagrl.backends.hf_model import load_tokenizer
from dagrl.data.builtin import tiny_model_path
from dagrl.data.messages import conversation_ids, fill_from_messages
from dagrl.errors import DataError
from tests.conftest import compose_config

CHAT = [
    {"role": "system", "content": "add"},
    {"role": "user", "content": "1+2="},
    {"role": "assistant", "content": "3"},
    {"role": "user", "content": "2+2="},
    {"role": "assistant", "content": "4"},
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(tiny_model_path())


def test_assistant_turns_only_are_masked_in(tokenizer):
    prompt, response, mask = conversation_ids(tokenizer, CHAT, "row 0")
    assert tokenizer.decode(prompt) == "<|system|>add<|end|><|user|>1+2=<|end|><|assistant|>"
    trained = tokenizer.decode([t for t, m in zip(response, mask) if m])
    context = tokenizer.decode([t for t, m in zip(response, mask) if not m])
    # each assistant turn with its end-of-turn token; the user turn and the next header are context
    assert trained == "3<|end|>4<|end|>"
    assert context == "<|user|>2+2=<|end|><|assistant|>"
    assert len(response) == len(mask)


def test_messages_row_fills_the_layout():
    row = fill_from_messages({"messages": CHAT})
    assert row["prompt"] == CHAT[:2] and row["reward_model"]["ground_truth"] == "4"
    assert row["data_source"] == "sft"


def test_conversation_without_assistant_turn_is_refused(tokenizer):
    with pytest.raises(DataError, match="row 3: 'messages' needs"):
        conversation_ids(tokenizer, CHAT[:2], "row 3")


def test_messages_parquet_collates_loss_mask(tokenizer, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dagrl.data.parquet import PromptDataset
    from dagrl.trainer.loop import collate

    path = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": CHAT}, {"messages": CHAT[1:3]}]), path)
    dataset = PromptDataset(str(path), tokenizer, max_prompt_length=32)
    source = ("prompts", "prompt_mask", "dataset_responses", "dataset_response_mask", "dataset_loss_mask")
    batch = collate(dataset.examples, tokenizer.pad_token_id, 1, 0, source, response_width=16)
    assert batch["dataset_loss_mask"][1].sum() == 2  # "3<|end|>"
    trained = (batch["dataset_loss_mask"] * batch["dataset_response_mask"]).sum(1)
    assert trained.tolist() == batch["dataset_loss_mask"].sum(1).tolist()  # only real tokens train
    assert batch["dataset_loss_mask"][0].sum() < batch["dataset_response_mask"][0].sum()


def test_sft_objective_is_the_nll_of_masked_tokens():
    from dagrl.core.batch import Batch
    from dagrl.objectives import TokenOutputs
    from dagrl.objectives.sft import SFTObjective
    from tests.conftest import compose_config

    objective = SFTObjective(compose_config("algorithm=sft"))
    logprobs = torch.tensor([[-1.0, -2.0, -4.0], [-3.0, -5.0, 0.0]])
    mb = Batch(
        {
            "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
            "loss_mask": torch.tensor([[0, 1, 1], [1, 0, 0]]),
        }
    )
    loss, metrics = objective.loss(mb, TokenOutputs(logprobs=logprobs))
    assert loss.item() == pytest.approx((2 + 4 + 3) / 3)  # token mean over the loss mask only
    halves = [mb.index([0]), mb.index([1])]
    assert objective.micro_batch_weights(mb, halves) == pytest.approx([2 / 3, 1 / 3])


@pytest.mark.parametrize("size", [8, 4])
def test_sft_takes_one_optimizer_step_per_batch_of_any_size(size):
    """The preset's mini-batch is data.train_batch_size (one step per batch), not a fixed 16 that
    would refuse every smaller batch."""
    from dagrl.trainer.setup import prepare

    cfg = compose_config("algorithm=sft", f"data.train_batch_size={size}", "trainer.dry_run=true")
    prepare(cfg)
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == size
    override = compose_config(
        "algorithm=sft", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=2"
    )
    assert override.actor_rollout_ref.actor.ppo_mini_batch_size == 2
