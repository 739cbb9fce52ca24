"""Make what a real verl run needs, with no download (run on the GPU machine).

- a byte-level BPE tokenizer trained with ``tokenizers`` on generated arithmetic text, with a
  ChatML chat template, saved so that ``AutoTokenizer`` loads it;
- random-init ``Qwen2ForCausalLM`` models (untied embeddings: verl's meta-device init hung on
  tied ones), saved in bf16: ``small`` (~55M parameters), ``big`` (~0.4B) and ``xl`` (~1.5B),
  the last two for optimizer offload;
- parquet train/val files in verl's RL schema: ``data_source``, ``prompt`` (a chat list),
  ``ability``, ``reward_model{style, ground_truth}``, ``extra_info{split, index}``.

    python3 bench/real_verl/setup_job.py --out /tmp/verl_real [--models small,big]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SIZES = {
    "small": dict(hidden_size=640, intermediate_size=1792, num_hidden_layers=10,
                  num_attention_heads=10, num_key_value_heads=2),
    "big": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                num_attention_heads=16, num_key_value_heads=4),
    "xl": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
               num_attention_heads=16, num_key_value_heads=4),
}
#: sizes initialised on the GPU (a 1.5B init on the CPU takes long); the others stay on the CPU
#: so their weights are those of earlier sessions
ON_GPU = {"xl"}
VOCAB = 8192


def _problem(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    op = rng.choice(["+", "-", "*"])
    ans = {"+": a + b, "-": a - b, "*": a * b}[op]
    q = rng.choice(["What is {a} {op} {b}?", "Compute {a} {op} {b}.",
                    "A box holds {a} apples and we apply {op} {b}. How many?"])
    return q.format(a=a, op=op, b=b) + " Answer with a number.", str(ans)


def make_tokenizer(out: Path, rng: random.Random) -> Path:
    """Train the tokenizer on generated problems and answers; return its folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = []
    for _ in range(20000):
        q, a = _problem(rng)
        text.append(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
                    f"The answer is {a}.<|im_end|>")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None,
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token=None)
    fast.chat_template = CHATML
    path = out / "tokenizer"
    fast.save_pretrained(str(path))
    return path


def make_model(out: Path, size: str, tok_dir: Path) -> Path:
    """Random-init bf16 Qwen2 of the given size, saved with the tokenizer beside it."""
    import shutil

    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    cfg = Qwen2Config(vocab_size=len(tok), max_position_embeddings=1024,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id,
                      rms_norm_eps=1e-6, rope_theta=10000.0, **SIZES[size])
    torch.manual_seed(0)
    device = "cuda" if size in ON_GPU and torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    path = out / f"model_{size}"
    model.save_pretrained(str(path))
    for f in tok_dir.iterdir():
        shutil.copy(f, path / f.name)
    n = sum(p.numel() for p in model.parameters())
    print(f"model {size}: {n / 1e6:.1f}M parameters -> {path}")
    return path


def make_data(out: Path, rng: random.Random, n_train: int, n_val: int) -> None:
    """Train and validation parquet files in verl's RL schema."""
    import pandas as pd

    for split, n in (("train", n_train), ("test", n_val)):
        rows = []
        for i in range(n):
            q, a = _problem(rng)
            rows.append({
                "data_source": "synthetic/arith",
                "prompt": [{"role": "user", "content": q}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": a},
                "extra_info": {"split": split, "index": i},
            })
        pd.DataFrame(rows).to_parquet(out / f"{split}.parquet")
    print(f"data: {n_train} train / {n_val} val rows -> {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/verl_real")
    ap.add_argument("--models", default="small,big")
    ap.add_argument("--train-rows", type=int, default=2048)
    ap.add_argument("--val-rows", type=int, default=64)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    tok_dir = make_tokenizer(out, rng)
    for size in filter(None, args.models.split(",")):
        make_model(out, size, tok_dir)
    make_data(out, rng, args.train_rows, args.val_rows)
    (out / "setup.json").write_text(json.dumps({"models": args.models, "vocab": VOCAB}))


if __name__ == "__main__":
    main()
