"""Training data from the target itself: its continuations of prompts, and a corpus it scores.

Only token ids are kept; the teacher signal, the target's full distribution at every position,
is computed each training step (train.kl_loss). Prompts come from --prompts (read by
specdec.prompts; plain text goes through a chat model's template as a user turn), else random
prefixes of --corpus, else the target's own samples after its BOS token. The target continues
each prompt greedily or by sampling, with specdec's own loop and engine: the text the draft is
trained on is the text it will be asked to predict when serving.
"""
from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..runtime.engine import Engine
from ..decoding.local import LocalVerifier
from ..decoding.loop import speculate
from ..prompts import PromptsError, encode, load_prompts
from ..records import Request
from ..runtime.sampling import SamplingParams
from .checks import DistillError

# Without --heldout, every 20th prompt (5 %), or the corpus' last 5 %, is held out.
HELDOUT_EVERY = 20


@dataclass
class Data:
    rows: torch.Tensor          # [N, L] target-written sequences (prompt + continuation), 0-padded
    lengths: torch.Tensor       # [N]
    stream: torch.Tensor        # [S] the corpus as one id stream, each document ended by eos
    heldout: list[list[int]]    # held-out prompts for measuring acceptance
    sources: dict               # what was used, for the report
    continuations: list[list[int]] = field(default_factory=list)  # the target's, of heldout

    def save(self, path: Path) -> None:
        torch.save(self.__dict__, path)

    @classmethod
    def load(cls, path: Path) -> "Data":
        return cls(**torch.load(path, map_location="cpu"))


def read_corpus(path: Path) -> list[str]:
    """Documents: a file's text, the "text" fields of a .jsonl file, or every UTF-8 file under a
    directory (hidden entries and binary files skipped), in path order."""
    if not path.exists():
        raise DistillError(f"--corpus {path}: does not exist")
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(path).parts))
    texts = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if f.suffix == ".jsonl":
            texts += [json.loads(line)["text"] for line in text.splitlines() if line.strip()]
        elif text.strip():
            texts.append(text)
    if not texts:
        raise DistillError(f"--corpus {path}: no UTF-8 text found")
    return texts


def encode_prompts(tokenizer, prompts: list, chat: bool) -> list[list[int]]:
    """Token ids of prompts as specdec.prompts reads them (text, or chat messages): text as the
    server's preprocessing makes it, or, for a chat model, as a user turn in its template."""
    try:
        return [encode(tokenizer, [{"role": "user", "content": p}] if chat and isinstance(p, str)
                       else p) for p in prompts]
    except PromptsError as e:
        raise DistillError(str(e)) from None


def token_stream(tokenizer, texts: list[str], eos: int | None) -> torch.Tensor:
    """All documents encoded and joined, each followed by eos: [S] int64."""
    ids: list[int] = []
    for doc in tokenizer(texts)["input_ids"]:
        ids += doc + ([eos] if eos is not None and doc[-1:] != [eos] else [])
    return torch.tensor(ids, dtype=torch.int64)


def random_windows(stream: torch.Tensor, gen: torch.Generator, rows: int,
                   length: int) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - length, (rows, 1), generator=gen)
    return stream[starts + torch.arange(length)]                    # [rows, length]


class _NoDraft:
    """The drafter of requests with no draft tokens: the loop never calls it."""

    async def propose(self, call):
        raise AssertionError("a request with num_draft_tokens 0 asked for a proposal")

    async def release(self, seq_id: int) -> None:
        pass


class _Recorder(LocalVerifier):
    """Keeps every token the target returns, eos included (the loop shows none past it)."""

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self.tokens: dict[int, list[int]] = defaultdict(list)

    async def verify(self, call):
        verdict = await super().verify(call)
        self.tokens[call.seq_id] += verdict.tokens
        return verdict


def generate(engine: Engine, prompts: list[list[int]], max_new: int,
             sampling: list[SamplingParams], eos: tuple[int, ...] = (), progress=None
             ) -> list[list[int]]:
    """The target's continuation of each prompt (at most max_new tokens, ending with its eos
    when it writes one): specdec's loop with no draft tokens, as many prompts at a time as the
    engine has slots, batched as the server batches concurrent requests."""
    out: list[list[int]] = []
    width = engine.pool.num_slots
    for first in range(0, len(prompts), width):
        recorder = _Recorder(engine)
        wave = range(first, min(first + width, len(prompts)))

        async def run():
            await asyncio.gather(*(speculate(
                i, Request(prompts[i], max_new, 0, sampling[i], eos=eos), _NoDraft(), recorder,
                engine.max_len, lambda chunk: None) for i in wave))

        asyncio.run(run())
        for i in wave:
            tokens = recorder.tokens[i][:max_new]
            end = next((j + 1 for j, t in enumerate(tokens) if t in eos), len(tokens))
            out.append(tokens[:end])
        if progress is not None:
            progress.update(len(wave))
    return out


def sampled_prompts(engine: Engine, n: int, length: int, bos: int, seed: int,
                    progress=None) -> list[list[int]]:
    """n prefixes the target writes itself after its BOS token, at temperature 1."""
    sampling = [SamplingParams(temperature=1.0, seed=seed + i) for i in range(n)]
    return [[bos] + c for c in generate(engine, [[bos]] * n, length - 1, sampling,
                                        progress=progress)]


def training_rows(engine: Engine, prompts: list[list[int]], n: int, new: int,
                  greedy_fraction: float, temperature: float, seed: int, eos: tuple[int, ...],
                  progress=None) -> tuple[torch.Tensor, torch.Tensor]:
    """n sequences, prompt + target continuation, cycling over the prompts: the first
    round(n * greedy_fraction) greedy (one per distinct prompt at most), the others sampled."""
    greedy = min(len(prompts), round(n * greedy_fraction))
    chosen = [prompts[i % len(prompts)] for i in range(n)]
    sampling = [SamplingParams() if i < greedy else
                SamplingParams(temperature=temperature, seed=seed + i) for i in range(n)]
    rows = [p + c for p, c in zip(chosen, generate(engine, chosen, new, sampling, eos, progress))]
    lengths = torch.tensor([len(r) for r in rows])
    padded = torch.zeros(n, int(lengths.max()), dtype=torch.int64)
    for i, r in enumerate(rows):
        padded[i, : len(r)] = torch.tensor(r)
    return padded, lengths


def step_batch(data: Data, step: int, seed: int, rows: int, seq_len: int, max_rows: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s batch, the same whether the run was resumed or not: (tokens [B, T],
    lengths [B]). With both sources, even steps take corpus windows and odd steps the target's
    sequences, as many rows (up to max_rows) as make the same token count."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    use_rows = len(data.rows) > 0 and (len(data.stream) == 0 or step % 2 == 1)
    if use_rows:
        n = min(max_rows, max(1, rows * seq_len // data.rows.shape[1]))
        idx = torch.randint(0, len(data.rows), (n,), generator=gen)
        return data.rows[idx], data.lengths[idx]
    return random_windows(data.stream, gen, rows, seq_len), torch.full((rows,), seq_len)


def build(args, tokenizer, target: Engine, eos: tuple[int, ...], bos: int, max_prompt: int,
          max_heldout: int, progress) -> Data:
    """Everything the run trains and measures on, from the options (see cli.py)."""
    chat = tokenizer.chat_template is not None and not args.no_chat_template
    seed = args.seed << 32
    sources: dict = {"chat_template": chat}
    stream, held_stream = torch.zeros(0, dtype=torch.int64), None
    if args.corpus:
        full = token_stream(tokenizer, read_corpus(args.corpus), eos[0] if eos else None)
        cut = len(full) if args.heldout or args.prompts else len(full) - len(full) // HELDOUT_EVERY
        stream, held_stream = full[:cut], full[cut:]
        if len(stream) <= args.seq_len:
            raise DistillError(f"--corpus {args.corpus}: {len(stream)} training tokens, fewer "
                               f"than --seq-len {args.seq_len}")
        sources.update(corpus=str(args.corpus), corpus_tokens=len(stream))
    heldout = None
    if args.prompts:
        prompts = encode_prompts(tokenizer, _load(args.prompts), chat)
        if not args.heldout:
            heldout = prompts[::HELDOUT_EVERY]
            prompts = [p for i, p in enumerate(prompts) if i % HELDOUT_EVERY]
            if not prompts:
                raise DistillError(f"--prompts {args.prompts}: too few prompts to hold 5 % out "
                                   f"for measuring; give --heldout FILE")
        sources.update(prompts=str(args.prompts), prompt_source="--prompts")
    elif args.steps == 0:
        prompts = []
    elif args.corpus:
        gen = torch.Generator().manual_seed(args.seed)
        prompts = random_windows(stream, gen, args.gen_sequences, args.prompt_tokens).tolist()
        sources["prompt_source"] = "random corpus windows"
    else:
        progress.reset(args.gen_sequences)
        progress.set_description("target writes prompts")
        prompts = sampled_prompts(target, args.gen_sequences, args.prompt_tokens, bos, seed,
                                  progress)
        sources["prompt_source"] = "the target's samples after its BOS token"
    if args.heldout:
        heldout = encode_prompts(tokenizer, _load(args.heldout), chat)
        sources["heldout"] = str(args.heldout)
    elif heldout is None and held_stream is not None:
        starts = torch.linspace(0, len(held_stream) - args.prompt_tokens, args.eval_prompts)
        heldout = [held_stream[int(s):int(s) + args.prompt_tokens].tolist() for s in starts]
        sources["heldout"] = "windows of the corpus' last 5 %"
    elif heldout is None:
        heldout = sampled_prompts(target, args.eval_prompts, args.prompt_tokens, bos,
                                  seed + (1 << 30))
        sources["heldout"] = "the target's samples after its BOS token (other seeds)"
    heldout = [p[-max_heldout:] for p in heldout[: args.eval_prompts]]
    rows, lengths = torch.zeros(0, 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    if args.steps == 0:   # the initial draft alone: nothing to train on
        return Data(rows, lengths, stream, heldout, {**sources, "heldout_prompts": len(heldout)})
    if args.gen_sequences:
        progress.reset(args.gen_sequences)
        progress.set_description("target writes continuations")
        rows, lengths = training_rows(target, [p[-max_prompt:] for p in prompts],
                                      args.gen_sequences, args.gen_tokens, args.greedy_fraction,
                                      args.temperature, seed + (1 << 31), eos, progress)
        sources.update(generated_sequences=len(rows), generated_tokens=int(lengths.sum()))
    sources["heldout_prompts"] = len(heldout)
    return Data(rows, lengths, stream, heldout, sources)


def _load(path: Path) -> list:
    try:
        return load_prompts(path)
    except PromptsError as e:
        raise DistillError(str(e)) from None
