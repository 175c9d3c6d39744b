"""The chat template's turn delimiters as token ids, computed once per tokenizer.

A multi-turn rollout never re-tokenizes its history: the policy's sampled ids stay as sampled, and
each observation becomes `prefix + encode(content) + suffix`, where prefix/suffix are what the
chat template writes between the end of an assistant turn (its EOS, sampled by the policy) and the
observation's content, and from the content to the next assistant turn's generation prompt.
Decoding the history and tokenizing it again would not give the sampled ids back in general (a
model can spell a special token out of plain pieces, or split a word differently from BPE), and
the trainer would then score tokens the policy never produced (trl#5224, verl#6501).
"""

from __future__ import annotations

from dataclasses import dataclass

from dagrl.errors import ConfigError

_ANSWER, _OBSERVATION = "\x00ASSISTANT-TURN\x00", "\x00OBSERVATION\x00"


@dataclass(frozen=True)
class TurnTemplate:
    observation_prefix: tuple[int, ...]
    observation_suffix: tuple[int, ...]

    def observation_ids(self, content_ids: list[int]) -> list[int]:
        """The token ids of one observation turn, through the next generation prompt."""
        return [*self.observation_prefix, *content_ids, *self.observation_suffix]


def turn_template(tokenizer, role: str, key: str) -> TurnTemplate:
    """Delimiters of an observation turn of `role`, read off the tokenizer's chat template."""
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _ANSWER}]
    try:
        text = tokenizer.apply_chat_template(
            [*chat, {"role": role, "content": _OBSERVATION}], tokenize=False, add_generation_prompt=True
        )
    except Exception as e:  # jinja raises for roles a template does not know
        raise ConfigError(key, role, f"the model's chat template cannot render this role ({e})") from e
    if _ANSWER not in text or _OBSERVATION not in text:
        raise ConfigError(key, role, "the model's chat template drops turns of this role; name another role")
    cut = text.index(_ANSWER) + len(_ANSWER)
    # the policy's turn ends at the EOS it sampled: the template's end-of-turn text is that token
    for eos in _eos_texts(tokenizer):
        if text.startswith(eos, cut):
            cut += len(eos)
            break
    prefix, suffix = text[cut:].split(_OBSERVATION)
    encode = lambda s: tuple(tokenizer.encode(s, add_special_tokens=False))  # noqa: E731
    return TurnTemplate(encode(prefix), encode(suffix))


def _eos_texts(tokenizer) -> list[str]:
    texts = [tokenizer.eos_token] if tokenizer.eos_token else []
    for name in ("<|im_end|>", "<|end|>", "<|eot_id|>"):
        if name in tokenizer.get_vocab() and name not in texts:
            texts.append(name)
    return texts


def truncate(ids: list[int], limit: int, side: str) -> list[int]:
    """At most `limit` ids: side right keeps the start, left the end, middle both ends."""
    if len(ids) <= limit:
        return ids
    if side == "right":
        return ids[:limit]
    if side == "left":
        return ids[-limit:]
    head = (limit + 1) // 2
    return ids[:head] + ids[len(ids) - (limit - head) :]
