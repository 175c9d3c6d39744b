"""Multi-turn SFT rows: a `messages` column (ms-swift's and the OpenAI chat layout) holding a whole
conversation, trained with the loss on the assistant turns only.

    messages: [{role: system|user, ...}, {role: assistant, ...}, {role: user, ...}, {role: assistant, ...}]

The prompt is every message before the first assistant turn (what the policy is given); the
response is the rest of the conversation under the chat template, and the loss mask marks the
tokens of each assistant turn (its content and the template's end-of-turn tokens, so the model
learns to stop), never the user/system turns between them. The spans come from rendering the
conversation's prefixes: turn i's tokens run from the end of ``template(messages[:i],
generation prompt)`` to the end of ``template(messages[:i+1])``; a template whose renderings are
not prefixes of one another (it rewrites earlier turns) is refused, naming the row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagrl.errors import ConfigError, DataError

MESSAGES = "messages"


def fill_from_messages(row: dict) -> dict:
    """A `messages` row with the layout's other columns filled where absent: prompt = the messages
    before the first assistant turn; ground_truth = the last assistant turn (so rule rewards and
    the greedy accuracy of validation can score it); data_source `sft`; ability `chat`."""
    messages = row.get(MESSAGES)
    if not isinstance(messages, (list, tuple)) or row.get("prompt") is not None:
        return row
    first = next(
        (i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"), None
    )
    last = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "assistant"), None)
    filled = {
        "data_source": "sft",
        "ability": "chat",
        "reward_model": {"style": "none", "ground_truth": (last or {}).get("content") or "-"},
        "extra_info": {},
    }
    return {**filled, **row, "prompt": list(messages[: first if first else len(messages)])}


def conversation_ids(
    tokenizer: Any, messages: list[dict], source: str
) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, loss mask over the response ids) of one conversation."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if not first:
        raise DataError(
            f"{source}: 'messages' needs a user turn and then at least one assistant turn to train on"
        )
    prompt = render_messages(tokenizer, messages[:first], generation_prompt=True)
    full = render_messages(tokenizer, messages, generation_prompt=False)
    mask = [0] * len(full)
    for i in range(first, len(messages)):
        if messages[i]["role"] != "assistant":
            continue
        start = len(render_messages(tokenizer, messages[:i], generation_prompt=True))
        end = render_messages(tokenizer, messages[: i + 1], generation_prompt=False)
        if full[: len(end)] != end:
            raise DataError(
                f"{source}: the chat template renders turn {i} differently inside the whole conversation"
                " (it rewrites earlier turns), so the assistant tokens cannot be located; use a template"
                " whose renderings of a conversation's prefixes are prefixes of it"
            )
        mask[start : len(end)] = [1] * (len(end) - start)
    if full[: len(prompt)] != prompt:
        raise DataError(f"{source}: the chat template's prompt is not a prefix of the conversation")
    return prompt, full[len(prompt) :], mask[len(prompt) :]


def render_messages(tokenizer: Any, messages: list[dict], generation_prompt: bool) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template (with or without the generation prompt)."""
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ConfigError(
            "actor_rollout_ref.model.path",
            name,
            "this tokenizer has no chat_template; use a model dir whose tokenizer_config.json "
            "(or chat_template.jinja) defines one, e.g. an -Instruct model",
        )
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True)
    # transformers 5 returns a BatchEncoding here; older versions return a plain list.
    if isinstance(ids, Mapping):
        ids = ids["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):
        assert len(ids) == 1, "one conversation in, one sequence out"
        ids = ids[0]
    return [int(token) for token in ids]
