"""Build the embedded default model pair: a small Llama target and a draft distilled from it.

Everything is made locally from the Python standard library's own source code, so the project
ships a working target/draft pair without downloading weights:

1. Split the stdlib ``.py`` files (no site-packages, test dirs or idlelib) into train and a
   deterministic 5% held-out set (by SHA-256 of the relative path).
2. Train a byte-level BPE tokenizer (vocab 4096, ``<|endoftext|>`` = id 0 as eos/bos/pad) on
   the training files.
3. Train the target (LlamaForCausalLM, grouped-query attention, tied embeddings) from scratch
   with next-token prediction on random 256-token windows; save it as a bf16 checkpoint.
4. Cut held-out prompts, then make the draft with ``specdec distill`` (specdec/distill), the
   tool users run on their own targets, with ``--draft-config`` of the draft's shape (much
   smaller, untied embeddings, trained from scratch): the target greedily continues random
   training prefixes, and the draft trains on KL(target || draft) at temperature 1, alternating
   batches of real windows (``--corpus``: the training files) and of target-written sequences.
   The tool measures held-out acceptance with the project's engine (its distill_report.json).
5. Reload both checkpoints from disk and measure held-out loss; write ``report.json``.

Training runs under bf16 autocast; the teacher, the generation and the evaluation compute in
float32 on the bf16-rounded weights, as CPU bf16 kernels are slow at small batch. The default
step counts were picked from the speed measured on a 2-core x86-64 CPU so that the whole run
takes about 25 minutes there; with fixed seeds and step counts the run is deterministic.
``--target-minutes`` instead picks the target's step count from the speed measured during its
warmup, to fit another machine's budget (the count used is recorded in the report).
``--reuse-target`` keeps OUT/target (and its tokenizer) and only remakes the draft. Nothing
touches the network.

    .venv/bin/python scripts/make_default_models.py [--out models/default] [--reuse-target]
"""

import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import sysconfig
import tempfile
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see specdec/distill/__init__.py

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM,  # noqa: E402
                          PreTrainedTokenizerFast)

from specdec import cli  # noqa: E402
from specdec.runtime.config import ModelArgs  # noqa: E402
from specdec.distill import report as distill_report, train  # noqa: E402
from specdec.distill.data import random_windows, token_stream  # noqa: E402

SEED = 0
EOT = "<|endoftext|>"
VOCAB_SIZE = 4096
SEQ_LEN = 256
SKIP_DIRS = {"site-packages", "test", "tests", "idlelib"}
HELDOUT_PERCENT = 5

COMMON = dict(vocab_size=VOCAB_SIZE, max_position_embeddings=2048, rms_norm_eps=1e-6,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
              bos_token_id=0, eos_token_id=0, pad_token_id=0)
TARGET = dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
              intermediate_size=704, tie_word_embeddings=True)
DRAFT = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=384, tie_word_embeddings=False)

TARGET_STEPS = 760        # about 11 minutes on 2 cores (0.85 s/step)
DRAFT_STEPS = 900         # about 8 minutes on 2 cores, teacher forward included
WARMUP_STEPS = 50         # linear warmup; the step count is fixed when it ends
CALIBRATION_START = 10    # steps CALIBRATION_START..WARMUP_STEPS-1 are timed to pick the step
                          # count (the first steps run slower while memory is being allocated)
LOG_EVERY = 20
GEN_PREFIX, GEN_NEW = 48, 80   # target-written distillation data: prefix and continuation
NUM_PROMPTS, PROMPT_MIN_TOKENS, PROMPT_MAX_TOKENS = 64, 20, 60


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def load_stdlib():
    """Return (train, heldout) lists of (relative path, source text), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    train_files, heldout = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_DIRS & set(rel.parts[:-1]):
            continue
        bucket = int.from_bytes(hashlib.sha256(rel.as_posix().encode()).digest()[:8], "big") % 100
        (heldout if bucket < HELDOUT_PERCENT else train_files).append(
            (rel.as_posix(), path.read_text(encoding="utf-8")))
    return train_files, heldout


def train_tokenizer(texts):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOT, bos_token=EOT,
                                   pad_token=EOT, clean_up_tokenization_spaces=False)


def costs(path):
    """Parameters and matmul FLOPs per token of a forward pass (attention scores and norms left
    out) of the checkpoint in `path`."""
    summary = distill_report.model_summary(ModelArgs.from_dir(path))
    head = summary["vocab_size"] * summary["hidden_size"]
    return {"parameters": summary["parameters"],
            "non_embedding_parameters": summary["non_embedding_parameters"],
            "forward_flops_per_token": 2 * (summary["non_embedding_parameters"] + head)}


def train_target(model, stream, generator, *, batch, lr, steps, minutes):
    """Next-token prediction with specdec.distill.train's optimizer and schedule.

    With steps=None the step count is the one that fits ``minutes`` at the speed measured during
    warmup. Returns (steps, tokens, seconds).
    """
    opt = train.optimizer(model, lr)
    start = time.time()
    tokens = step = 0
    recent = []  # losses since the last log line
    while steps is None or step < steps:
        if step == CALIBRATION_START:
            clock = time.time()
        if steps is None and step == WARMUP_STEPS:
            per_step = (time.time() - clock) / (WARMUP_STEPS - CALIBRATION_START)
            steps = max(step, round((minutes * 60 - (time.time() - start)) / per_step) + step)
            log(f"target: {per_step:.2f} s/step -> {steps} steps")
        # Before the step count is known the schedule is still in its warmup.
        scale = train.lr_scale(step, steps or WARMUP_STEPS + 1, WARMUP_STEPS)
        windows = random_windows(stream, generator, batch, SEQ_LEN + 1)
        recent.append(train.step(model, opt, lambda: next_token_loss(model, windows), lr * scale))
        tokens += windows.numel()
        step += 1
        if step % LOG_EVERY == 0 or step == steps:
            elapsed = time.time() - start
            eta = f"{elapsed / step * (steps - step):.0f}s" if steps else "?"
            log(f"target step {step}/{steps or '?'} loss {sum(recent) / len(recent):.3f} "
                f"{tokens / elapsed:.0f} tok/s eta {eta}")
            recent = []
    return steps, tokens, time.time() - start


def next_token_loss(model, batch):
    logits = model(input_ids=batch[:, :-1]).logits.float()
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def cut_prompts(tokenizer, heldout):
    """Prompts of PROMPT_MIN..MAX_TOKENS tokens: whole lines of held-out files, last newline cut."""
    rng = random.Random(SEED)
    prompts = []
    while len(prompts) < NUM_PROMPTS:
        lines = rng.choice(heldout)[1].splitlines(keepends=True)
        first = rng.randrange(len(lines))
        if not lines[first].strip():
            continue
        for last in range(first + 1, len(lines) + 1):
            prompt = "".join(lines[first:last]).removesuffix("\n")
            length = len(tokenizer.encode(prompt))
            if length >= PROMPT_MIN_TOKENS:
                break
        if PROMPT_MIN_TOKENS <= length <= PROMPT_MAX_TOKENS and prompt not in prompts:
            prompts.append(prompt)
    return prompts


@torch.no_grad()
def heldout_loss(model, stream):
    windows = stream[: len(stream) // (SEQ_LEN + 1) * (SEQ_LEN + 1)].view(-1, SEQ_LEN + 1)
    losses = [next_token_loss(model, batch).item() * len(batch) for batch in windows.split(16)]
    return sum(losses) / len(windows)


def save(model, tokenizer, directory):
    """Save as bf16; the model is left in float32 holding the bf16-rounded weights."""
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    model.float().eval()


def distill_draft(out, train_files, args):
    """The draft, made by `specdec distill` as a user would make it (one run, in process)."""
    with tempfile.TemporaryDirectory() as tmp:
        corpus, config = Path(tmp) / "train.jsonl", Path(tmp) / "draft_config.json"
        with open(corpus, "w") as f:
            f.writelines(json.dumps({"text": text}) + "\n" for _, text in train_files)
        config.write_text(json.dumps(DRAFT))
        code = cli.main([
            "distill", "--target", str(out / "target"), "--out", str(out / "draft"),
            "--overwrite", "--corpus", str(corpus), "--draft-config", str(config),
            "--heldout", str(out / "heldout_prompts.jsonl"), "--eval-prompts", str(NUM_PROMPTS),
            "--steps", str(args.draft_steps), "--batch", str(args.batch),
            "--seq-len", str(SEQ_LEN), "--lr", "3e-3", "--warmup", str(WARMUP_STEPS),
            "--gen-sequences", str(args.gen_sequences), "--prompt-tokens", str(GEN_PREFIX),
            "--gen-tokens", str(GEN_NEW), "--greedy-fraction", "1", "--seed", str(SEED),
            "--checkpoint-every", "100", "--device", "cpu", "--threads", str(args.threads)])
    if code:
        raise SystemExit(f"specdec distill failed ({code})")
    return json.loads((out / "draft" / "distill_report.json").read_text())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("models/default"))
    parser.add_argument("--reuse-target", action="store_true",
                        help="keep OUT/target and its tokenizer; only remake the draft")
    parser.add_argument("--target-steps", type=int, default=TARGET_STEPS)
    parser.add_argument("--draft-steps", type=int, default=DRAFT_STEPS)
    parser.add_argument("--target-minutes", type=float,
                        help="fit the target's training into this budget instead of --target-steps")
    parser.add_argument("--gen-sequences", type=int, default=4096,
                        help="target-written sequences for distillation")
    parser.add_argument("--batch", type=int, default=16, help="sequences per training step")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    begin = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)

    train_files, heldout_files = load_stdlib()
    log(f"{len(train_files)} training files, {len(heldout_files)} held-out files")
    if args.reuse_target:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(args.out / "target")
    else:
        tokenizer = train_tokenizer([text for _, text in train_files])
    for _, text in heldout_files:
        assert tokenizer.decode(tokenizer.encode(text)) == text, "tokenizer does not round-trip"
    train_stream = token_stream(tokenizer, [text for _, text in train_files], 0)
    heldout_stream = token_stream(tokenizer, [text for _, text in heldout_files], 0)
    log(f"tokenizer ready: {len(train_stream)} training, {len(heldout_stream)} held-out tokens")

    if args.reuse_target:
        old = json.loads((args.out / "report.json").read_text())["target"]
        target_steps, target_tokens, target_seconds = (
            old["train_steps"], old["train_tokens"], old["train_seconds"])
        log(f"reusing {args.out / 'target'}")
    else:
        target = LlamaForCausalLM(LlamaConfig(**COMMON, **TARGET))
        target_steps, target_tokens, target_seconds = train_target(
            target, train_stream, generator, batch=args.batch, lr=2e-3,
            steps=None if args.target_minutes else args.target_steps,
            minutes=args.target_minutes)
        save(target, tokenizer, args.out / "target")

    prompts = cut_prompts(tokenizer, heldout_files)
    with open(args.out / "heldout_prompts.jsonl", "w") as f:
        f.writelines(json.dumps({"prompt": prompt}) + "\n" for prompt in prompts)
    distilled = distill_draft(args.out, train_files, args)

    log("held-out loss of both models")
    target = AutoModelForCausalLM.from_pretrained(args.out / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.out / "draft", dtype=torch.float32).eval()
    target_cost, draft_cost = costs(args.out / "target"), costs(args.out / "draft")
    k4 = distilled["heldout"]["per_k"]["4"]
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, no GPU",
        "torch": torch.__version__, "threads": args.threads,
        "data": {"train_files": len(train_files), "heldout_files": len(heldout_files),
                 "train_tokens": len(train_stream), "heldout_tokens": len(heldout_stream),
                 "vocab_size": VOCAB_SIZE},
        "target": {**target_cost, "config": TARGET, "train_steps": target_steps,
                   "train_tokens": target_tokens, "train_seconds": round(target_seconds)},
        "draft": {**draft_cost, "config": DRAFT, "train_steps": args.draft_steps,
                  "train_seconds": distilled["training"]["seconds"],
                  "generated_sequences": distilled["data"]["generated_sequences"],
                  "distill_command": distilled["command"]},
        "draft_to_target": {
            "parameters": round(draft_cost["parameters"] / target_cost["parameters"], 3),
            "non_embedding_parameters": round(draft_cost["non_embedding_parameters"]
                                              / target_cost["non_embedding_parameters"], 3),
            "forward_flops_per_token": round(draft_cost["forward_flops_per_token"]
                                             / target_cost["forward_flops_per_token"], 3)},
        "eval": {"prompts": len(prompts), "tokens_per_prompt":
                 distilled["heldout"]["tokens_per_prompt"],
                 "heldout_loss_target": round(heldout_loss(target, heldout_stream), 4),
                 "heldout_loss_draft": round(heldout_loss(draft, heldout_stream), 4),
                 "acceptance_by_position": distilled["heldout"]["acceptance_by_position"],
                 "acceptance_rate_k4": k4["a"], "tokens_per_target_call_k4":
                 k4["tokens_per_round"], "c": distilled["heldout"]["c"],
                 "best_k": distilled["heldout"]["best_k"]},
        "total_seconds": round(time.time() - begin),
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    log(json.dumps(report["eval"]))
    log(f"done in {report['total_seconds']}s")


if __name__ == "__main__":
    main()
