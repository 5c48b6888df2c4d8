"""Build the embedded default model pair: a small Llama target and a draft distilled from it.

Everything is made locally from the Python standard library's own source code, so the project
ships a working target/draft pair without downloading weights:

1. Split the stdlib ``.py`` files (no site-packages, test dirs or idlelib) into train and a
   deterministic 5% held-out set (by SHA-256 of the relative path).
2. Train a byte-level BPE tokenizer (vocab 4096, ``<|endoftext|>`` = id 0 as eos/bos/pad) on
   the training files.
3. Train the target (LlamaForCausalLM, grouped-query attention, tied embeddings) from scratch
   with next-token prediction on random 256-token windows.
4. Let the bf16 target greedily continue random training prefixes, then train the draft (much
   smaller, untied embeddings) with KL(target || draft) at temperature 1, alternating batches of
   real windows and of target-generated continuations.
5. Save both as bf16 Hugging Face checkpoints with the same tokenizer, cut held-out prompts,
   reload the checkpoints from disk and measure held-out loss, greedy agreement and the
   speculative-decoding acceptance rate (K=4, greedy verification); write ``report.json``.

Training (and the teacher's forward pass) runs under bf16 autocast; greedy decoding and the
evaluation compute in float32 on the bf16-rounded weights, as CPU bf16 kernels are slow at small
batch. The default step counts were picked from the speed measured on a 2-core x86-64 CPU so
that the whole run takes about 25 minutes there; with fixed seeds and step counts the run is
deterministic. ``--target-minutes``/``--draft-minutes`` instead pick each phase's step count from
the speed measured during its warmup, to fit another machine's budget (the counts used are
recorded in the report). Nothing touches the network.

    .venv/bin/python scripts/make_default_models.py [--out models/default] [--target-minutes M]
"""

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import random
import sysconfig
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM,  # noqa: E402
                          PreTrainedTokenizerFast)

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
GEN_PREFIX, GEN_NEW, GEN_BATCH = 48, 80, 128  # target-generated distillation data
NUM_PROMPTS, PROMPT_MIN_TOKENS, PROMPT_MAX_TOKENS = 64, 20, 60
AGREEMENT_TOKENS = 32     # (a) draft vs target along the target's greedy continuation
SPEC_K, SPEC_NEW_TOKENS = 4, 64  # (b) simulated greedy speculative decoding


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def load_stdlib():
    """Return (train, heldout) lists of (relative path, source text), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    train, heldout = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_DIRS & set(rel.parts[:-1]):
            continue
        bucket = int.from_bytes(hashlib.sha256(rel.as_posix().encode()).digest()[:8], "big") % 100
        (heldout if bucket < HELDOUT_PERCENT else train).append(
            (rel.as_posix(), path.read_text(encoding="utf-8")))
    return train, heldout


def train_tokenizer(texts):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOT, bos_token=EOT,
                                   pad_token=EOT, clean_up_tokenization_spaces=False)


def token_stream(tokenizer, texts):
    """All texts encoded and joined, each followed by <|endoftext|>, as one 1-D tensor."""
    eot = tokenizer.eos_token_id
    ids = []
    for encoding in tokenizer.backend_tokenizer.encode_batch(texts):
        ids.extend(encoding.ids)
        ids.append(eot)
    return torch.tensor(ids)


def random_windows(stream, generator, batch, length):
    starts = torch.randint(0, len(stream) - length, (batch, 1), generator=generator)
    return stream[starts + torch.arange(length)]


def count_parameters(model):
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    non_embedding = total - embedding - (0 if model.config.tie_word_embeddings else embedding)
    # Matmul FLOPs per token of a forward pass (attention scores and norms left out).
    return {"parameters": total, "non_embedding_parameters": non_embedding,
            "forward_flops_per_token": 2 * (non_embedding + embedding)}


def train(model, loss_fn, next_batch, *, lr, steps, minutes, name):
    """AdamW, linear warmup, cosine decay to lr/10. ``loss_fn(batch) -> loss`` runs the forward.

    With steps=None the step count is the one that fits ``minutes`` at the speed measured during
    warmup. Returns (steps, tokens, seconds).
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    start = time.time()
    tokens = step = 0
    recent = []  # losses since the last log line
    while steps is None or step < steps:
        if step == CALIBRATION_START:
            clock = time.time()
        if steps is None and step == WARMUP_STEPS:
            per_step = (time.time() - clock) / (WARMUP_STEPS - CALIBRATION_START)
            steps = max(step, round((minutes * 60 - (time.time() - start)) / per_step) + step)
            log(f"{name}: {per_step:.2f} s/step -> {steps} steps")
        if step < WARMUP_STEPS:
            scale = (step + 1) / WARMUP_STEPS
        else:
            progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
            scale = 0.1 + 0.45 * (1 + math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        batch = next_batch(step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += batch.numel()
        recent.append(loss.item())
        step += 1
        if step % LOG_EVERY == 0 or step == steps:
            elapsed = time.time() - start
            eta = f"{elapsed / step * (steps - step):.0f}s" if steps else "?"
            log(f"{name} step {step}/{steps or '?'} loss {sum(recent) / len(recent):.3f} "
                f"{tokens / elapsed:.0f} tok/s eta {eta}")
            recent = []
    return steps, tokens, time.time() - start


def next_token_loss(model, batch):
    logits = model(input_ids=batch[:, :-1]).logits.float()
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def distill_loss(teacher, student, batch):
    """KL(teacher || student) per token at temperature 1."""
    with torch.no_grad():
        teacher_logp = teacher(input_ids=batch).logits.float().log_softmax(-1)
    student_logp = student(input_ids=batch).logits.float().log_softmax(-1)
    return F.kl_div(student_logp.flatten(0, 1), teacher_logp.flatten(0, 1), log_target=True,
                    reduction="batchmean")


@torch.no_grad()
def greedy(model, ids, new_tokens):
    """ids (batch, length) followed by new_tokens greedy tokens, decoded with the KV cache."""
    out = model(input_ids=ids, use_cache=True)
    generated = [out.logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(new_tokens - 1):
        out = model(input_ids=generated[-1], past_key_values=out.past_key_values, use_cache=True)
        generated.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat([ids, *generated], dim=1)


def generate_continuations(target, stream, generator, sequences):
    log(f"generating {sequences} target continuations of {GEN_NEW} tokens")
    start = time.time()
    rows = []
    for done in range(0, sequences, GEN_BATCH):
        prefixes = random_windows(stream, generator, min(GEN_BATCH, sequences - done), GEN_PREFIX)
        rows.append(greedy(target, prefixes, GEN_NEW))
        log(f"generated {done + len(prefixes)}/{sequences} ({time.time() - start:.0f}s)")
    return torch.cat(rows)


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


@torch.no_grad()
def speculate(target, draft, ids):
    """Greedy speculative decoding of SPEC_NEW_TOKENS tokens; returns (accepted, proposed, rounds)."""
    accepted = rounds = 0
    end = ids.shape[1] + SPEC_NEW_TOKENS
    while ids.shape[1] < end:
        proposal = greedy(draft, ids, SPEC_K)[:, ids.shape[1]:]
        verified = target(input_ids=torch.cat([ids, proposal], 1)).logits[0, ids.shape[1] - 1:]
        verified = verified.argmax(-1)
        matches = (verified[:SPEC_K] == proposal[0]).int()
        n = int(matches.cumprod(0).sum())
        ids = torch.cat([ids, verified[None, :n + 1]], 1)
        accepted += n
        rounds += 1
    return accepted, rounds * SPEC_K, rounds


def evaluate(target, draft, tokenizer, prompts, heldout_stream):
    log("evaluating on held-out data")
    agree = total = accepted = proposed = rounds = 0
    for index, prompt in enumerate(prompts):
        if index % 16 == 0:
            log(f"prompt {index}/{len(prompts)}")
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        continuation = greedy(target, ids, AGREEMENT_TOKENS)
        draft_pred = draft(input_ids=continuation[:, :-1]).logits[0, ids.shape[1] - 1:].argmax(-1)
        agree += int((draft_pred == continuation[0, ids.shape[1]:]).sum())
        total += AGREEMENT_TOKENS
        a, p, r = speculate(target, draft, ids)
        accepted, proposed, rounds = accepted + a, proposed + p, rounds + r
    return {"heldout_loss_target": round(heldout_loss(target, heldout_stream), 4),
            "heldout_loss_draft": round(heldout_loss(draft, heldout_stream), 4),
            "greedy_agreement": round(agree / total, 4),
            "acceptance_rate": round(accepted / proposed, 4),
            "mean_accepted_per_round": round(accepted / rounds, 3),
            "tokens_per_target_call": round((accepted + rounds) / rounds, 3)}


def save(model, tokenizer, directory):
    """Save as bf16; the model is left in float32 holding the bf16-rounded weights."""
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    model.float().eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("models/default"))
    parser.add_argument("--target-steps", type=int, default=TARGET_STEPS)
    parser.add_argument("--draft-steps", type=int, default=DRAFT_STEPS)
    parser.add_argument("--target-minutes", type=float,
                        help="fit the target's training into this budget instead of --target-steps")
    parser.add_argument("--draft-minutes", type=float,
                        help="fit the draft's training into this budget instead of --draft-steps")
    parser.add_argument("--gen-sequences", type=int, default=4096,
                        help="target-generated sequences for distillation")
    parser.add_argument("--batch", type=int, default=16, help="sequences per training step")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    begin = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)

    train_files, heldout_files = load_stdlib()
    log(f"{len(train_files)} training files, {len(heldout_files)} held-out files")
    tokenizer = train_tokenizer([text for _, text in train_files])
    for _, text in heldout_files:
        assert tokenizer.decode(tokenizer.encode(text)) == text, "tokenizer does not round-trip"
    train_stream = token_stream(tokenizer, [text for _, text in train_files])
    heldout_stream = token_stream(tokenizer, [text for _, text in heldout_files])
    log(f"tokenizer ready: {len(train_stream)} training, {len(heldout_stream)} held-out tokens")

    target = LlamaForCausalLM(LlamaConfig(**COMMON, **TARGET))
    target_steps, target_tokens, target_seconds = train(
        target, lambda batch: next_token_loss(target, batch),
        lambda step: random_windows(train_stream, generator, args.batch, SEQ_LEN + 1),
        lr=2e-3, steps=None if args.target_minutes else args.target_steps,
        minutes=args.target_minutes, name="target")
    save(target, tokenizer, args.out / "target")

    gen_start = time.time()
    generated = generate_continuations(target, train_stream, generator, args.gen_sequences)
    gen_seconds = time.time() - gen_start
    draft = LlamaForCausalLM(LlamaConfig(**COMMON, **DRAFT))
    gen_batch = args.batch * SEQ_LEN // generated.shape[1]

    def draft_batch(step):
        """Alternate real windows and target-generated continuations (same token count)."""
        if step % 2 == 0:
            return random_windows(train_stream, generator, args.batch, SEQ_LEN)
        return generated[torch.randint(0, len(generated), (gen_batch,), generator=generator)]

    draft_steps, draft_tokens, draft_seconds = train(
        draft, lambda batch: distill_loss(target, draft, batch), draft_batch,
        lr=3e-3, steps=None if args.draft_minutes else args.draft_steps,
        minutes=args.draft_minutes, name="draft")
    save(draft, tokenizer, args.out / "draft")

    prompts = cut_prompts(tokenizer, heldout_files)
    with open(args.out / "heldout_prompts.jsonl", "w") as f:
        f.writelines(json.dumps({"prompt": prompt}) + "\n" for prompt in prompts)
    target = AutoModelForCausalLM.from_pretrained(args.out / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.out / "draft", dtype=torch.float32).eval()
    metrics = evaluate(target, draft, tokenizer, prompts, heldout_stream)
    target_cost, draft_cost = count_parameters(target), count_parameters(draft)
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()}-core {platform.machine()} CPU, no GPU",
        "torch": torch.__version__, "threads": args.threads,
        "data": {"train_files": len(train_files), "heldout_files": len(heldout_files),
                 "train_tokens": len(train_stream), "heldout_tokens": len(heldout_stream),
                 "vocab_size": VOCAB_SIZE},
        "target": {**target_cost, "config": TARGET, "train_steps": target_steps,
                   "train_tokens": target_tokens, "train_seconds": round(target_seconds)},
        "draft": {**draft_cost, "config": DRAFT, "train_steps": draft_steps,
                  "train_tokens": draft_tokens, "train_seconds": round(draft_seconds),
                  "generated_sequences": len(generated), "generation_seconds": round(gen_seconds)},
        "draft_to_target": {
            "parameters": round(draft_cost["parameters"] / target_cost["parameters"], 3),
            "non_embedding_parameters": round(draft_cost["non_embedding_parameters"]
                                              / target_cost["non_embedding_parameters"], 3),
            "forward_flops_per_token": round(draft_cost["forward_flops_per_token"]
                                             / target_cost["forward_flops_per_token"], 3)},
        "eval": {"prompts": len(prompts), "agreement_tokens": AGREEMENT_TOKENS,
                 "spec_k": SPEC_K, "spec_new_tokens": SPEC_NEW_TOKENS, **metrics},
        "total_seconds": round(time.time() - begin),
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    log(json.dumps(report["eval"]))
    log(f"done in {report['total_seconds']}s")


if __name__ == "__main__":
    main()
