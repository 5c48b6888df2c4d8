"""`specdec distill --method pard`: a draft that proposes K tokens in one pass (PARD).

The draft (a copy of the target's layers, or an autoregressive draft given by --from-draft)
learns to predict, at the committed prefix followed by i mask tokens, the token i + 1 places
ahead. One training row holds K copies of a sequence: copy 0 its tokens, copy i (1 <= i < K)
mask tokens at the same positions. The mask at position p of copy i stands for the i-th mask
after the prefix ending at p - i: it attends to the real tokens up to p - i and to the masks of
copies 1..i at positions p - i + 1..p, exactly what it sees when served (parallel_drafts.py).
Every copy's row p learns the target's whole distribution at p (KL, as the draft method): the
draft's q_i then approaches the target's next-token distribution averaged over the tokens it
cannot see, the best a proposal drawn without them can do.

The mask token is an id the tokenizer never yields (a padding row of the vocabulary), or a new
row appended to it. Its embedding trains even where the copied embeddings stay frozen.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ..runtime.config import CheckpointError, ModelArgs
from ..runtime.engine import Engine
from .checks import DistillError
from .train import mean_kl, student_head, teacher_hidden


PARD_ONLY = ("from_draft", "pard_k", "pard_token")


def check_options(args: argparse.Namespace, t: ModelArgs) -> ModelArgs | None:
    """Refuse its options with the other methods, and --from-draft beside another start; fill
    the defaults. Returns --from-draft's config (None: no --from-draft)."""
    if args.method != "pard":
        given = [o for o in PARD_ONLY if getattr(args, o) is not None]
        if given:
            flags = ", ".join("--" + o.replace("_", "-") for o in given)
            raise DistillError(f"{flags}: not an option of --method {args.method} (they belong "
                               f"to --method pard)")
        return None
    args.pard_k = 4 if args.pard_k is None else args.pard_k
    if not 2 <= args.pard_k <= 16:
        raise DistillError(f"--pard-k {args.pard_k}: must be within 2..16")
    d = None if args.from_draft is None else _draft_args(args, t)
    vocab = (d or t).vocab_size
    if args.pard_token is not None and not 0 <= args.pard_token < vocab:
        raise DistillError(f"--pard-token {args.pard_token}: not a token id below the draft's "
                           f"vocab_size {vocab}")
    return d


def _draft_args(args: argparse.Namespace, t: ModelArgs) -> ModelArgs:
    if args.layers or args.draft_config:
        raise DistillError("--from-draft: the draft to convert is the start; --layers and "
                           "--draft-config choose another")
    try:
        cfg = json.loads((Path(args.from_draft) / "config.json").read_text())
        d = ModelArgs.from_dict(cfg, f"--from-draft {args.from_draft}/config.json")
    except (OSError, json.JSONDecodeError, CheckpointError) as e:
        raise DistillError(f"--from-draft {args.from_draft}: not a checkpoint: {e}") from None
    if d.vocab_size < t.vocab_size:
        raise DistillError(f"--from-draft {args.from_draft}: vocab_size {d.vocab_size} is "
                           f"below the target's {t.vocab_size}: it must score every target id")
    return d


def from_draft(path: Path) -> torch.nn.Module:
    """An autoregressive draft checkpoint as a float32 transformers model to train on."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def mask_token(tokenizer_size: int, vocab_size: int, wanted: int | None) -> int:
    """--pard-token (checked), else the first vocabulary row past the tokenizer's, else
    vocab_size (a row appended)."""
    return wanted if wanted is not None else min(tokenizer_size, vocab_size)


def prepare(model: torch.nn.Module, mask: int, frozen: bool) -> None:
    """The draft's vocabulary grown to hold the mask (a new row: the embeddings' mean), its
    config naming it; with frozen embeddings, the mask's row alone learns."""
    vocab = model.get_input_embeddings().weight.shape[0]
    if mask >= vocab:
        model.resize_token_embeddings(mask + 1, mean_resizing=False)
        with torch.no_grad():
            for m in {model.get_input_embeddings(), model.get_output_embeddings()}:
                m.weight[vocab:] = m.weight[:vocab].mean(0)
    model.config.pard_token = mask
    if not frozen:
        return
    embeddings = model.get_input_embeddings().weight
    embeddings.requires_grad_(True)
    only = torch.zeros(embeddings.shape[0], 1, dtype=embeddings.dtype,
                       device=embeddings.device)
    only[mask] = 1
    # AdamW (weight decay 0) leaves a row whose gradient is always zero where it is.
    embeddings.register_hook(lambda grad: grad * only)


def attention(k: int, t: int, device: torch.device) -> torch.Tensor:
    """[1, 1, K T, K T] True where a query (copy i, position p) attends to a key (copy j,
    position r): j = 0 and r <= p - i, or 1 <= j <= i and r = p - i + j."""
    i = torch.arange(k, device=device).repeat_interleave(t)                   # [K T] copy
    p = torch.arange(t, device=device).repeat(k)                              # [K T] position
    qi, qp, kj, kr = i[:, None], p[:, None], i[None, :], p[None, :]
    real = (kj == 0) & (kr <= qp - qi)
    masks = (kj >= 1) & (kj <= qi) & (kr == qp - qi + kj)
    return (real | masks)[None, None]


def loss(draft: torch.nn.Module, target: Engine, tokens: torch.Tensor, lengths: torch.Tensor,
         k: int, mask: int, chunk: int) -> torch.Tensor:
    """Mean over every copy's learning rows of KL(target || draft): copy i's row p learns when
    the prefix ending at p - i is real (p >= i) and p is a real token."""
    tokens = tokens.to(target.device)
    b, t = tokens.shape
    real = torch.arange(t, device=tokens.device) < lengths.to(tokens.device)[:, None]   # [B, T]
    teacher = teacher_hidden(target, tokens, lengths)                                   # [B, T, D]
    ids = torch.cat([tokens] + [torch.full_like(tokens, mask)] * (k - 1), 1)            # [B, K T]
    positions = torch.arange(t, device=tokens.device).repeat(k)[None].expand(b, -1)
    hidden = draft.model(input_ids=ids, position_ids=positions, use_cache=False,
                         attention_mask=attention(k, t, tokens.device)).last_hidden_state
    hidden = hidden.view(b, k, t, -1)
    s, tt = [], []
    for i in range(k):
        rows = real.clone()
        rows[:, :i] = False
        s.append(hidden[:, i][rows])
        tt.append(teacher[rows])
    head, v = student_head(draft), target.vocab_size
    return mean_kl(lambda h: head(h)[..., :v], target, torch.cat(s), torch.cat(tt), chunk)
