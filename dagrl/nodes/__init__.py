"""Built-in node kinds. Importing this package registers them."""

# sft: SFT's sft_data and val_loss
from dagrl.nodes import advantage, logprob, reward, rollout, sft, teacher, update, weight_sync  # noqa: F401
