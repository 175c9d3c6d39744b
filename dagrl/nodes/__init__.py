"""Built-in node kinds. Importing this package registers them."""

# sft: SFT's sft_data and val_loss
from dagrl.nodes import (  # noqa: F401
    advantage,
    critic,
    logprob,
    reward,
    reward_model,  # noqa: F401,I001  (orm_score, rm_score, prm_score, sample_score)
    reward_terms,  # kl_in_reward, distill_reward, turn_credit
    rollout,
    sft,
    teacher,
    update,
    weight_sync,
)
