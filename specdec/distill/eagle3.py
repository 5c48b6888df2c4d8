"""Training an EAGLE-3 head for a target (Li et al. 2025, "EAGLE-3: Scaling up Inference
Acceleration of Large Language Models via Training-Time Test"), as EAGLE's and SpecForge's
trainers do it, with specdec's own target forward as the teacher.

At position t the pair (fc(the target's features at t), embedding of token t + 1) predicts
token t + 2. Training-time test unrolls S steps: step 0 feeds the target's features; step s
feeds, at branch t, the head's own step s - 1 output there and the token at t + 1 + s (the data's,
as EAGLE and SpecForge do), at RoPE position t + s. Its query sees step 0's keys at positions
<= t and the same branch's keys of steps 1..s: what the served head sees when it drafts s tokens
past a committed position t (SpecForge's "diagonal" attention). Each step's loss is KL(target ||
head) over the draft vocabulary (the target's next-token distribution at t + 1 + s restricted to
the draft ids and renormalised), weighted 0.8^s.

The draft vocabulary is the most frequent target ids in the training data (ties to the lower
id), sorted by id: draft id i is target id i + d2t[i].
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..runtime.config import ModelArgs, Rope
from ..proposers.eagle.config import SPECULATORS, HeadArgs
from ..proposers.eagle.head import EagleHead
from ..runtime.kv_cache import KVCache
from ..runtime.batch import Batch
from ..runtime.model import RMSNorm, Transformer, rope_table, rotation
from ..runtime.weights import load_model
from . import data, train

DECAY = 0.8               # step s's loss weight is DECAY ** s (EAGLE, SpecForge)
MAX_DRAFT_VOCAB = 32000   # EAGLE-3's published heads' draft vocabulary
SERIALIZABLE_ROPES = ("default", "linear", "llama3")   # what the head's Llama config can say


def aux_layers(num_layers: int) -> tuple[int, ...]:
    """Target layers whose outputs the head fuses: EAGLE-3's (1, L // 2 - 1, L - 4) when these
    are three ascending layers (L >= 7). Smaller targets: the second layer, the middle one and
    the last but one of layers 1..L-2 (the default target's 6 layers: 1, 3, 4); below 5 layers,
    three spread over all of them ((0, 0, 1) for 2)."""
    low, mid, high = 1, num_layers // 2 - 1, num_layers - 4
    if low < mid < high:
        return low, mid, high
    inner = list(range(1, num_layers - 1))
    if len(inner) >= 3:
        return inner[0], inner[len(inner) // 2], inner[-1]
    return tuple(round(i * (num_layers - 1) / 2) for i in range(3))


def default_draft_vocab(vocab_size: int) -> int:
    return min(vocab_size, MAX_DRAFT_VOCAB)


def token_counts(ds: data.Data, vocab_size: int) -> torch.Tensor:
    """[V] occurrences of each id in the training data: the target's sequences and the corpus."""
    real = torch.arange(ds.rows.shape[1]) < ds.lengths[:, None]
    ids = torch.cat((ds.rows[real], ds.stream))
    return torch.bincount(ids, minlength=vocab_size)[:vocab_size]


def draft_vocabulary(counts: torch.Tensor, size: int) -> torch.Tensor:
    """[size] int64 ascending: the `size` most frequent ids, the lower id first among equals
    (so ids never seen fill the rest from 0 up, as SpecForge pads)."""
    order = torch.sort(-counts, stable=True).indices
    return order[:size].sort().values


def head_layer_args(t: ModelArgs) -> ModelArgs:
    """The head's decoder layer: a Llama layer at the target's geometry. RoPE as the target's
    global layers' when a Llama config can say it, else plain RoPE at its base."""
    rope = t.rope if t.rope.type in SERIALIZABLE_ROPES else Rope(theta=t.rope.theta)
    return ModelArgs(vocab_size=t.vocab_size, hidden_size=t.hidden_size,
                     intermediate_size=t.intermediate_size, num_layers=1, num_heads=t.num_heads,
                     num_kv_heads=t.num_kv_heads, head_dim=t.head_dim,
                     rms_norm_eps=t.rms_norm_eps,
                     max_position_embeddings=t.max_position_embeddings, rope=rope)


def initialised_head(h: HeadArgs, device: torch.device, seed: int = 0) -> EagleHead:
    """A head of shape `h` on `device`, initialised as torch does (seeded), all but its
    embedding, which stays unallocated (meta): a head uses its target's."""
    with torch.device("meta"):
        head = EagleHead(h)
    for name, module in head.named_children():
        if name != "embed_tokens":
            module.to_empty(device=device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for m in head.modules():
            if isinstance(m, nn.Linear):
                m.reset_parameters()
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)
    return head


def new_head(target: Transformer, aux: tuple[int, ...], used: torch.Tensor,
             seed: int = 0) -> EagleHead:
    """A fresh head in float32 on the target's device: the target's embedding shared and frozen,
    lm_head and the final norm the target's (its rows of the draft vocabulary), the rest
    initialised as torch does (seeded)."""
    t = target.args
    h = HeadArgs(head_layer_args(t), len(used), t.hidden_size, tuple(aux), False, SPECULATORS)
    device = target.lm_head.weight.device
    head = initialised_head(h, device, seed)
    head.embed_tokens.weight = target.model.embed_tokens.weight    # frozen: the target's
    with torch.no_grad():
        head.lm_head.weight.copy_(target.lm_head.weight[used.to(device)])
        norm = target.model.norm.weight.float()
        head.norm.weight.copy_(norm + 1 if target.args.gemma_norms else norm)
    head.d2t = (used - torch.arange(len(used))).to(device)
    head.inv_freq = rope_table(h.layer).to(device)
    return head


@torch.no_grad()
def teacher(model: Transformer, cache: KVCache, tokens: torch.Tensor, lengths: torch.Tensor,
            aux: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target over right-padded rows, in slots 0..B-1 of `cache`: (final hidden [B, T, D],
    the aux layers' outputs [B, T, 3 D])."""
    b, d = tokens.shape[0], model.args.hidden_size
    batch = Batch.build(tokens, [0] * b, list(range(b)), cache, tokens.device, lengths.tolist())
    kept, model.capture = model.capture, tuple(aux)
    try:
        with torch.autocast(tokens.device.type, enabled=False):   # its own dtype, as it serves
            out = model(batch, cache)
    finally:
        model.capture = kept
    return out[..., :d], out[..., d:]


def ttt_attention(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor],
                  scale: float) -> torch.Tensor:
    """q [B, N, H, D] of step s = len(ks) - 1 at branches 0..N-1; ks[0], vs[0] [B, N, KV, D]
    step 0's, seen causally; ks[i], vs[i] (i >= 1) step i's, each branch seeing its own only.
    Returns [B, N, H, D]."""
    b, n, h, d = q.shape
    kv = ks[0].shape[2]
    q = q.view(b, n, kv, h // kv, d)                      # the query heads of each KV head
    exact = torch.promote_types(q.dtype, torch.float32)   # scores in float32 at least
    s0 = torch.einsum("bnkgd,bmkd->bkgnm", q, ks[0]).to(exact) * scale    # [B, KV, G, N, N]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    s0 = s0.masked_fill(~causal, float("-inf"))
    diag = [torch.einsum("bnkgd,bnkd->bkgn", q, k).to(exact)[..., None] * scale for k in ks[1:]]
    p = torch.cat([s0, *diag], -1).softmax(-1)                            # [B, KV, G, N, N + s]
    out = torch.einsum("bkgnm,bmkd->bnkgd", p[..., :n].to(vs[0].dtype), vs[0])
    for i, v in enumerate(vs[1:]):
        w = p[..., n + i].permute(0, 3, 1, 2)[..., None].to(v.dtype)      # [B, N, KV, G, 1]
        out = out + w * v[:, :, :, None]
    return out.reshape(b, n, h, d)


def ttt_outputs(head: EagleHead, features: torch.Tensor, tokens: torch.Tensor,
                steps: int) -> list[torch.Tensor]:
    """The head's outputs h [B, N, H] (before its final norm) at each of `steps` TTT steps,
    N = T - 1 branches. features: [B, T, 3 Ht] the target's; tokens: [B, T]."""
    layer, a = head.layers[0], head.args.layer
    attn = layer.self_attn
    b, t_len = tokens.shape
    n = t_len - 1
    t = torch.arange(n, device=tokens.device)
    feature = head.fc(features[:, :n].to(head.fc.weight.dtype))                 # [B, N, H]
    ks, vs, out = [], [], []
    for s in range(steps):
        emb = head.embed_tokens(tokens[:, (t + 1 + s).clamp(max=t_len - 1)]).to(feature.dtype)
        x, residual = layer.attention_input(emb, feature)
        cos, sin = rotation(a.rope, head.inv_freq[0], (t + s).expand(b, n), x.dtype)
        q, k, v = attn.project(x, cos, sin)
        ks.append(k)
        vs.append(v)
        o = ttt_attention(q, ks, vs, attn.scale)
        feature = layer.after_attention(residual, attn.o_proj(o.reshape(b, n, -1)))
        out.append(feature)
    return out


class TeacherLogits:
    """The target's logits over the draft vocabulary: its LM head's rows of the draft ids (and
    Gemma 2's soft cap), so a 128k vocabulary costs only the draft ids' products."""

    def __init__(self, model: Transformer, used: torch.Tensor):
        self.model = model
        full = len(used) == model.args.vocab_size
        self.rows = None if full else model.lm_head.weight[used.to(model.lm_head.weight.device)]

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            return self.model.logits(hidden)
        logits = F.linear(hidden, self.rows).float()
        cap = self.model.args.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap


def ttt_loss(head: EagleHead, model: Transformer, cache: KVCache, tokens: torch.Tensor,
             lengths: torch.Tensor, steps: int, logits: TeacherLogits, chunk: int
             ) -> tuple[torch.Tensor, list[float]]:
    """(sum_s 0.8^s KL_s / sum_s 0.8^s, [KL_s]): KL_s the mean over valid branches of step s
    of KL(target || head) over the draft vocabulary. Branch t is valid at step s when t + 1 + s
    is a real token (the teacher's distribution there is the label)."""
    device = head.fc.weight.device
    tokens, lengths = tokens.to(device), lengths.to(device)
    tokens = tokens[:, : int(lengths.max())]
    hidden, features = teacher(model, cache, tokens, lengths, head.args.aux_layers)
    n = tokens.shape[1] - 1
    t = torch.arange(n, device=device)
    total, per_step = 0.0, []
    for s, h in enumerate(ttt_outputs(head, features, tokens, steps)):
        valid = (t + 1 + s)[None] < lengths[:, None]                              # [B, N]
        student = h[valid]                                                        # [M, H]
        target = hidden[:, (t + 1 + s).clamp(max=n)][valid]                       # [M, D]
        kl = _kl(head, logits, student, target, chunk) / max(1, len(student))
        per_step.append(kl.item())
        total = total + DECAY ** s * kl
    return total / sum(DECAY ** s for s in range(steps)), per_step


def _kl(head: EagleHead, logits: TeacherLogits, s: torch.Tensor, t: torch.Tensor,
        chunk: int) -> torch.Tensor:
    """Summed KL over rows, the draft-vocabulary logits `chunk` rows at a time (recomputed in
    backward when there is more than one chunk)."""
    if len(s) <= chunk:
        return _kl_sum(head, logits, s, t)
    return sum(checkpoint(_kl_sum, head, logits, s[i:i + chunk], t[i:i + chunk],
                          use_reentrant=False) for i in range(0, len(s), chunk))


def _kl_sum(head: EagleHead, logits: TeacherLogits, s: torch.Tensor, t: torch.Tensor):
    student = head.logits(s).log_softmax(-1)                                       # [m, Vd]
    with torch.no_grad():
        target = logits(t).log_softmax(-1)
    return F.kl_div(student, target, log_target=True, reduction="sum")


class Trainer:
    """One head's training state: the head, its optimizer, the teacher and its KV cache."""

    def __init__(self, model: Transformer, head: EagleHead, used: torch.Tensor, rows: int,
                 seq_len: int, lr: float, ttt_steps: int, cache: KVCache | None = None):
        a = model.args
        self.model, self.head, self.ttt_steps, self.lr = model, head, ttt_steps, lr
        self.cache = cache or KVCache(a.num_layers, rows, seq_len, a.num_kv_heads, a.head_dim,
                                      model.lm_head.weight.dtype, model.lm_head.weight.device)
        self.logits = TeacherLogits(model, used)
        self.chunk = train.chunk_tokens(len(used))
        self.opt = train.optimizer(head, lr)
        self.last_steps: list[float] = []   # the last step's KL per TTT step

    def step(self, tokens: torch.Tensor, lengths: torch.Tensor, lr: float) -> float:
        def loss():
            value, self.last_steps = ttt_loss(self.head, self.model, self.cache, tokens,
                                              lengths, self.ttt_steps, self.logits, self.chunk)
            return value
        self.head.train()
        return train.step(self.head, self.opt, loss, lr)


def train_head(target: str | Path | Transformer, sequences: list[list[int]], steps: int, *,
               ttt_steps: int = 3, batch: int = 8, lr: float = 3e-3, warmup: int = 10,
               aux: tuple[int, ...] | None = None, draft_vocab: int | None = None,
               seed: int = 0) -> EagleHead:
    """A head trained for `steps` steps on `sequences` (token lists the target wrote), `batch`
    of them per step: the run's core without its data, checkpoints or measurement (tests)."""
    model = target if isinstance(target, Transformer) else \
        load_model(target, torch.float32, "cpu")
    a = model.args
    lengths = torch.tensor([len(s) for s in sequences])
    rows = torch.zeros(len(sequences), int(lengths.max()), dtype=torch.int64)
    for i, s in enumerate(sequences):
        rows[i, : len(s)] = torch.tensor(s)
    ds = data.Data(rows, lengths, torch.zeros(0, dtype=torch.int64), [], {})
    used = draft_vocabulary(token_counts(ds, a.vocab_size),
                            draft_vocab or default_draft_vocab(a.vocab_size))
    head = new_head(model, aux or aux_layers(a.num_layers), used, seed)
    trainer = Trainer(model, head, used, batch, rows.shape[1], lr, ttt_steps)
    for i in range(steps):
        tokens, lens = data.step_batch(ds, i, seed, batch, rows.shape[1], batch)
        trainer.step(tokens, lens, lr * train.lr_scale(i, steps, warmup))
    return head.eval().requires_grad_(False)
