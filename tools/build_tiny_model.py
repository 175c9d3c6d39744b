"""Build ``dagrl/assets/tiny_arith``, the tiny model that dagrl's default run trains with GRPO, and
``dagrl/assets/tiny_arith_teacher``, the teacher that distillation runs (GKD, OPSD) learn from.

From scratch and seeded: a byte-level tokenizer, a ~0.8M-parameter Qwen2 model, supervised
pre-training on the train split of the built-in "arith" task, then a flattening of its output
distribution. Bit-identical on rebuild with the same torch.

What GRPO needs from the start point, and how we get it:
- Reward to learn from and room to climb: the right answer should usually be the mode (greedy
  accuracy ~0.9) while samples at T=1 are usually wrong (sampled accuracy ~0.3). Pre-training
  learns the sums; then the final RMSNorm weight is scaled down (logits / temperature, with the
  temperature found by bisection on train prompts) until the *expected* sampled accuracy is
  ``TARGET_SAMPLED_ACCURACY``. Sharpening that distribution back is what RL does in a few
  dozen steps (0.24 -> 0.54 sampled test accuracy in 60 GRPO steps of 16 prompts x 8 here).
  Training on noisy answers instead gives the same start but RL climbs ~3x slower.
- Weights that survive RL updates. The learning rate stays constant after warm-up: decaying it to
  zero lets the early layers sharpen until one Adam step of RL at lr 3e-4 wipes out the addition
  circuit (seen here: greedy accuracy 0.7 -> 0.0 in ten steps). At a constant 1e-3 the model stays
  flat enough for RL at lr 3e-4 (1e-3 still collapses it).

The teacher is the same pre-trained model before the flattening, then ``TEACHER_STEPS`` more
steps (same lr, seed ``SEED + 2``) on a half-and-half mix of plain and privileged prompts, so it
reads the built-in rows' privileged OPSD prompt (``37+45=? The answer is 82. 37+45=``): before
that stage it had never seen a prompt longer than ``a+b=`` and got 0.0 expected accuracy there.
Expected test accuracy at T=1 during that stage (plain / privileged; one run of the stage with a
fixed half-and-half split per batch): 0.87 / 0.00 at step 0, 0.82 / 0.16 (100), 0.88 / 0.70
(200), 0.86 / 0.86 (300), 0.88 / 0.82 (400), 0.91 / 0.96 (500). It keeps the student's
byte-level tokenizer and vocabulary. ``--teacher_init DIR`` runs the teacher stage alone from a
pre-trained model directory (what the full build reaches before it; nothing random is drawn in
between), leaving the student alone; the shipped teacher was made that way from the previously
shipped, pre-trained-only teacher, with OMP_NUM_THREADS=1 (CPU matmuls reduce in a
thread-count-dependent order, so the thread count is part of the recipe):

    OMP_NUM_THREADS=1 python tools/build_tiny_model.py --teacher_init <pre-trained dir> --teacher_steps 500

The student of the distillation
runs is ``tiny_arith`` itself: the same weights at a baked-in temperature of ~2.1, which its own
samples (~0.25 correct) must learn to undo from the teacher's distributions. Smaller or less
pre-trained students were tried and rejected: the addition circuit appears abruptly between 300
and 400 pre-training steps here, and students from before or during that jump (sampled accuracy
0.03-0.4) learned nothing or collapsed under 40 distillation steps at lr 1e-4..1e-3.

Runs on 2 idle CPU cores in about ten minutes (the teacher stage is most of it):

    python tools/build_tiny_model.py [--out DIR]

``--fresh DIR`` writes only the starting point of that build (the tokenizer and the architecture
with freshly initialised weights, ``--seed``): README's SFT-from-scratch run and its test start
there.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from dagrl.data.builtin import generate_rows, split_problems, tiny_model_path, tiny_teacher_path  # noqa: E402

PAD, EOS = "<|pad|>", "<|end|>"
ROLE_TOKENS = ["<|user|>", "<|assistant|>", "<|system|>"]
SPECIAL_TOKENS = [PAD, EOS, *ROLE_TOKENS]  # ids 0..4; byte b is id 5 + b
# transformers' Qwen2Tokenizer pre-tokenizer regex, kept identical (see build_tokenizer).
QWEN2_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MAX_POSITIONS = 64

SEED = 1234
PRETRAIN_STEPS = 800
PRETRAIN_BATCH = 128
PRETRAIN_LR = 1e-3
WARMUP_STEPS = 20
TARGET_SAMPLED_ACCURACY = 0.3
CALIBRATION_ROWS = 512
EVAL_ROWS = 512
TEACHER_STEPS = 500  # privileged-prompt steps of the teacher; see the module docstring


def build_tokenizer(out_dir: Path) -> PreTrainedTokenizerBase:
    """Byte-level tokenizer with no merges: every byte (so each printable ASCII char and "\\n") is one token.

    Why byte-level: transformers 5 ignores ``tokenizer_class`` for ``model_type: qwen2`` and rebuilds
    the pipeline as ``Qwen2Tokenizer`` (NFC, Qwen2's split regex, ByteLevel, BPE), which silently
    drops any char-level vocab entry that is not a ByteLevel symbol (spaces, newlines). So we build
    exactly that pipeline, with an empty merge list: BPE then leaves every byte alone, the tokenizer
    is character-level on ASCII, and it loads identically as ``Qwen2Tokenizer`` (transformers 5.x)
    and as ``PreTrainedTokenizerFast`` (4.x). The files are written by hand, not by
    ``save_pretrained``, so no version-specific keys leak in.
    """
    char_of_byte = _gpt2_bytes_to_unicode()
    byte_chars = [char_of_byte[b] for b in range(256)]
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + byte_chars)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.save(str(out_dir / "tokenizer.json"))

    special_map = {"pad_token": PAD, "eos_token": EOS, "additional_special_tokens": ROLE_TOKENS}
    added_tokens_decoder = {
        str(vocab[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added_tokens_decoder,
        "bos_token": None,
        "unk_token": None,
        **special_map,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out_dir / "tokenizer_config.json", config)
    _write_json(out_dir / "special_tokens_map.json", special_map)
    return AutoTokenizer.from_pretrained(out_dir)


def _gpt2_bytes_to_unicode() -> dict[int, str]:
    """The byte -> printable char table of ByteLevel (GPT-2): printable bytes map to themselves."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, shifted = {}, 0
    for b in range(256):
        if b in kept:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def build_model(tokenizer: PreTrainedTokenizerBase) -> Qwen2ForCausalLM:
    """A 4-layer Qwen2 small enough that a GRPO step on 128 samples takes well under a second on CPU."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rope_theta=10000.0,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    return Qwen2ForCausalLM(config)


def write_fresh_model(out: Path, seed: int = SEED) -> str:
    """The shipped model's tokenizer and architecture with freshly initialised weights, at ``out``
    (SFT from scratch: README "SFT"); the same draw of weights for the same ``seed``."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    torch.manual_seed(seed)
    model = build_model(tokenizer)
    model.generation_config.update(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=4)
    save_model(model, out)
    return str(out)


def save_model(model: Qwen2ForCausalLM, out_dir: Path) -> None:
    """``save_pretrained``, plus the transformers 4.x names of two config keys, world-readable files."""
    model.save_pretrained(out_dir)
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    # transformers 5 writes rope_parameters/dtype; 4.x reads rope_theta/torch_dtype. 5.x accepts both.
    config.setdefault("rope_theta", model.config.rope_parameters["rope_theta"])
    config.setdefault("torch_dtype", "float32")
    config.pop("transformers_version", None)
    _write_json(config_path, config)
    for path in out_dir.iterdir():
        path.chmod(0o644)  # save_pretrained may create 0600 files; the package must be readable by all


def sft_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], answers: list[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` [B, T] and ``labels`` [B, T], labels -100 outside answer + eos."""
    sequences, answer_masks = [], []
    for prompt_ids, answer in zip(prompts, answers):
        answer_ids = tokenizer.encode(answer, add_special_tokens=False)
        answer_ids.append(tokenizer.eos_token_id)
        sequences.append(prompt_ids + answer_ids)
        answer_masks.append([False] * len(prompt_ids) + [True] * len(answer_ids))
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    labels = torch.full((len(prompts), width), -100)
    for i, (seq, mask) in enumerate(zip(sequences, answer_masks)):
        input_ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, : len(seq)] = torch.where(torch.tensor(mask), torch.tensor(seq), -100)
    return input_ids, labels


def pretrain(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    steps: int,
    lr: float,
    privileged: bool = False,
    seed: int = SEED,
) -> None:
    """Supervised pre-training on the whole train split, loss on answer tokens only; with
    ``privileged``, every problem appears twice: after its prompt and after its teacher_prompt."""
    rows = generate_rows("train", len(split_problems("train")), seed=seed)
    examples = [(row, _prompt_ids(tokenizer, row)) for row in rows]  # render the chat template once
    if privileged:
        examples += [(row, _prompt_ids(tokenizer, {"prompt": row["teacher_prompt"]})) for row in rows]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP_STEPS))
    rng = random.Random(seed)
    model.train()
    for step in range(steps):
        batch = rng.sample(examples, PRETRAIN_BATCH)
        answers = [row["reward_model"]["ground_truth"] for row, _ in batch]
        input_ids, labels = sft_batch(tokenizer, [prompt for _, prompt in batch], answers)
        # Pads sit after each sequence, so causal attention never lets real tokens see them.
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  lr {schedule.get_last_lr()[0]:.2e}", flush=True)
    model.eval()


@torch.no_grad()
def expected_sampled_accuracy(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase, rows: list[dict]
) -> float:
    """Mean probability of sampling exactly the right answer + eos at T=1 (no sampling noise)."""
    prompts = [_prompt_ids(tokenizer, row) for row in rows]
    input_ids, labels = sft_batch(tokenizer, prompts, [row["reward_model"]["ground_truth"] for row in rows])
    logprobs = torch.log_softmax(model(input_ids=input_ids).logits[:, :-1].float(), dim=-1)
    targets = labels[:, 1:]
    token_logprobs = logprobs.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    answer_logprobs = (token_logprobs * (targets != -100)).sum(-1)  # [B]
    return answer_logprobs.exp().mean().item()


@torch.no_grad()
def flatten_to_target(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase, rows: list[dict], target: float
) -> float:
    """Scale the final RMSNorm weight (so all logits) until expected sampled accuracy on ``rows`` is ``target``.

    Returns the scale, i.e. 1 / the temperature baked into the weights. Greedy answers are unchanged.
    """
    base_weight = model.model.norm.weight.clone()
    low, high = 0.0, 1.0  # expected accuracy rises with the scale
    for _ in range(20):
        scale = (low + high) / 2
        model.model.norm.weight.copy_(base_weight * scale)
        if expected_sampled_accuracy(model, tokenizer, rows) < target:
            low = scale
        else:
            high = scale
    model.model.norm.weight.copy_(base_weight * high)
    return high


@torch.no_grad()
def generate_answers(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict],
    temperature: float,
    generator: torch.Generator | None = None,
    max_new_tokens: int = 4,
) -> list[str]:
    """Decoded answers for ``rows``: greedy when ``temperature == 0``, else sampled at ``temperature``."""
    prompts = [_prompt_ids(tokenizer, row) for row in rows]
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):  # left padding, so every row's next token is at column -1
        input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
        attention_mask[i, width - len(prompt) :] = 1
    done = torch.zeros(len(rows), dtype=torch.bool)
    for _ in range(max_new_tokens):
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[
            :, -1
        ]
        if temperature == 0:
            next_ids = logits.argmax(-1)
        else:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            next_ids = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        next_ids = torch.where(done, tokenizer.pad_token_id, next_ids)
        input_ids = torch.cat([input_ids, next_ids[:, None]], dim=1)
        attention_mask = torch.cat([attention_mask, (~done).long()[:, None]], dim=1)
        done |= next_ids == tokenizer.eos_token_id
        if done.all():
            break
    return tokenizer.batch_decode(input_ids[:, width:], skip_special_tokens=True)


def accuracy(answers: list[str], rows: list[dict]) -> float:
    correct = sum(a == row["reward_model"]["ground_truth"] for a, row in zip(answers, rows))
    return correct / len(rows)


def build_teacher(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase, out: Path, lr: float, steps: int
) -> None:
    """Teach the pre-trained model the privileged prompt for ``steps`` steps, save it to ``out``."""
    if steps:
        pretrain(model, tokenizer, steps, lr, privileged=True, seed=SEED + 2)
    save_model(model, out)
    rows = generate_rows("test", EVAL_ROWS, seed=0)
    privileged = [dict(row, prompt=row["teacher_prompt"]) for row in rows]
    plain, opsd = (expected_sampled_accuracy(model, tokenizer, r) for r in (rows, privileged))
    print(
        f"teacher: expected sampled test accuracy {plain:.3f} plain, {opsd:.3f} after the privileged prompt"
    )


def build_teacher_only(init: Path, out: Path, lr: float, steps: int) -> None:
    """The teacher stage alone, from a pre-trained model directory: the same weights, tokenizer and
    seeds as the full build's stage (no random numbers are drawn between pre-training and it)."""
    model = Qwen2ForCausalLM.from_pretrained(init, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(init)
    if out.resolve() != init.resolve():
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(init, out)  # tokenizer files (written by hand) travel with the weights
    build_teacher(model, tokenizer, out, lr, steps)


def _prompt_ids(tokenizer: PreTrainedTokenizerBase, row: dict) -> list[int]:
    text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(tiny_model_path()), help="model dir to (over)write")
    parser.add_argument(
        "--teacher_out", type=Path, default=Path(tiny_teacher_path()), help="teacher dir to (over)write"
    )
    parser.add_argument(
        "--teacher_steps", type=int, default=TEACHER_STEPS, help="teacher steps on privileged prompts"
    )
    parser.add_argument(
        "--teacher_init",
        type=Path,
        default=None,
        help="build only the teacher: its privileged-prompt stage from this pre-trained model "
        "directory (the pre-trained weights the full build reaches), leaving --out alone",
    )
    parser.add_argument("--steps", type=int, default=PRETRAIN_STEPS, help="pre-training steps")
    parser.add_argument(
        "--lr", type=float, default=PRETRAIN_LR, help="pre-training learning rate, constant after warm-up"
    )
    parser.add_argument(
        "--fresh",
        type=Path,
        default=None,
        help="write only a freshly initialised model (the shipped architecture and tokenizer, random "
        "weights, --seed) to this directory and stop: the start of README's SFT-from-scratch run",
    )
    parser.add_argument("--seed", type=int, default=SEED, help="seed of the initial weights")
    args = parser.parse_args()

    start = time.perf_counter()
    if args.fresh is not None:
        write_fresh_model(args.fresh, args.seed)
        return
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    if args.teacher_init is not None:
        build_teacher_only(args.teacher_init, args.teacher_out, args.lr, args.teacher_steps)
        return
    for out in (args.out, args.teacher_out):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
    tokenizer = build_tokenizer(args.out)
    build_tokenizer(args.teacher_out)
    model = build_model(tokenizer)
    pretrain(model, tokenizer, args.steps, args.lr)
    model.generation_config.update(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=4)
    student_state = {k: v.clone() for k, v in model.state_dict().items()}
    build_teacher(model, tokenizer, args.teacher_out, args.lr, args.teacher_steps)
    model.load_state_dict(student_state)
    calibration_rows = generate_rows("train", CALIBRATION_ROWS, seed=SEED + 1)
    trained = expected_sampled_accuracy(model, tokenizer, calibration_rows)
    scale = flatten_to_target(model, tokenizer, calibration_rows, TARGET_SAMPLED_ACCURACY)
    print(f"expected sampled accuracy on train prompts {trained:.3f} -> {TARGET_SAMPLED_ACCURACY}: ", end="")
    print(f"final norm weight scaled by {scale:.4f} (temperature {1 / scale:.2f})")
    save_model(model, args.out)
    build_seconds = time.perf_counter() - start

    test_rows = generate_rows("test", EVAL_ROWS, seed=0)
    greedy = accuracy(generate_answers(model, tokenizer, test_rows, temperature=0.0), test_rows)
    generator = torch.Generator().manual_seed(0)
    sampled = accuracy(generate_answers(model, tokenizer, test_rows, 1.0, generator), test_rows)
    expected = expected_sampled_accuracy(model, tokenizer, test_rows)
    params = sum(p.numel() for p in model.parameters())
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"wrote {args.out}: {params:,} params, {size:,} bytes on disk")
    print(
        f"test accuracy on {EVAL_ROWS} prompts: greedy {greedy:.3f}, "
        f"sampled (T=1.0) {sampled:.3f} (expected {expected:.3f})"
    )
    print(
        f"build {build_seconds:.1f}s, total {time.perf_counter() - start:.1f}s on {torch.get_num_threads()} threads"
    )


if __name__ == "__main__":
    main()
