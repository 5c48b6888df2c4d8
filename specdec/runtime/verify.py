"""Verification of drafted tokens against the target (Leviathan et al. 2023, Algorithm 1).

Draft token d_j ~ q_j is accepted with probability min(1, p_j(d_j) / q_j(d_j)); at the first
rejection the target's token is drawn from normalize(max(0, p_j - q_j)); if all k pass, a bonus
token is drawn from p_{k+1}. The output then follows p exactly. With temperature 0 both p and q
are one-hot (sampling.probabilities), so this is the exact-match rule with the target's argmax as
correction: token-identical to the target's own greedy decoding.

A deterministic proposal (a greedy draft, n-gram lookup) has q one-hot at its token d: it is
accepted with probability p(d), and the residual max(0, p - onehot(d)) is p with d removed.
"""
from __future__ import annotations

import torch

from .sampling import ACCEPT, RESAMPLE, BatchSampling, sample, uniforms


def verify(p: torch.Tensor, q: torch.Tensor | None, drafts: torch.Tensor, num_drafts: torch.Tensor,
           s: BatchSampling, first_position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a prefix of each row's drafts and draw the token that follows it.

    p: [B, K+1, V] target distributions at the drafted positions and the one after.
    q: [B, K, V] draft distributions (rows are zero past a row's own num_drafts), or None when
       every row's proposal was deterministic: q is then one-hot at the drafts, so q(d) = 1
       and the residual is p with the rejected draft zeroed (no [B, K, V] tensor needed).
    drafts: [B, K] drafted ids; num_drafts: [B] k_b <= K.
    first_position: [B] absolute position of the first drafted token.
    Returns (num_accepted [B], next_token [B]): output is drafts[:m] + [next_token].
    """
    b, k = drafts.shape
    positions = first_position[:, None] + torch.arange(k + 1, device=p.device)    # [B, K+1]
    if k > 0:
        p_d = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)                   # [B, K]
        q_d = torch.ones_like(p_d) if q is None else q.gather(-1, drafts[..., None]).squeeze(-1)
        u = uniforms(s, positions[:, :k], ACCEPT).squeeze(-1)                      # [B, K]
        ok = (u * q_d <= p_d) & (torch.arange(k, device=p.device) < num_drafts[:, None])
        accepted = ok.to(torch.int64).cumprod(-1).sum(-1)                          # [B]
    else:
        accepted = torch.zeros(b, dtype=torch.int64, device=p.device)
    idx = accepted[:, None, None].expand(b, 1, p.shape[-1])
    p_m = p.gather(1, idx)                                                         # [B, 1, V]
    if q is None:
        residual = p_m
        if k > 0:  # zero d_m where it was rejected; past a row's drafts p_m is the bonus's p
            d_m = drafts.gather(1, accepted.clamp(max=k - 1)[:, None])[..., None]     # [B, 1, 1]
            rejected = (accepted < num_drafts)[:, None, None]                          # [B, 1, 1]
            residual = p_m.scatter(-1, d_m, torch.where(rejected, 0.0, p_m.gather(-1, d_m)))
    else:
        # Past a row's drafts q is zero, so the residual there is p itself: the bonus token.
        q_full = torch.cat([q, torch.zeros_like(p[:, :1])], dim=1)                 # [B, K+1, V]
        residual = (p_m - q_full.gather(1, idx)).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    # p == q leaves no residual mass; rejection then has probability 0, any choice is unbiased.
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_m)
    next_token = sample(residual, s, positions.gather(1, accepted[:, None]), RESAMPLE)[:, 0]
    return accepted, next_token


def verify_greedy(logits: torch.Tensor, drafts: torch.Tensor,
                  num_drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`verify` where every row is greedy: p is one-hot at the argmax of the target's logits
    [B, K+1, V], so a draft is accepted exactly when it is the argmax (q(d) > 0 for a drafted
    d, and any u > 0) and the token after the accepted run is the argmax there, whatever q is.
    The same result without a [B, K+1, V] tensor of probabilities."""
    top = logits.argmax(-1)                                                        # [B, K+1]
    b, k = drafts.shape
    if k > 0:
        ok = (drafts == top[:, :k]) & (torch.arange(k, device=top.device) < num_drafts[:, None])
        accepted = ok.to(torch.int64).cumprod(-1).sum(-1)                          # [B]
    else:
        accepted = torch.zeros(b, dtype=torch.int64, device=top.device)
    return accepted, top.gather(1, accepted[:, None])[:, 0]
