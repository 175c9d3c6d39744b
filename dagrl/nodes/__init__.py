"""Built-in node kinds. Importing this package registers them."""

from dagrl.nodes import advantage, logprob, reward, rollout, teacher, update, weight_sync  # noqa: F401
