"""The wire format between the orchestrator and draft_model / target_model, both directions.

A call is one Triton request with batch dimension 1; every tensor below is [1, ...]. Every
tensor is allocated, described and mapped on both sides of the Python backend's process
boundary on every call, so a call's scalars travel packed (three tensors instead of up to nine):

    call      INT64 [9]  sequence id, start position, num_draft_tokens k, top_k,
                         seed, release (1: free the sequence's slot, nothing else),
                         next_k (verify: tokens a drafter in the target's process drafts for
                         the next round; -1: none does), drafts_in_target (1: the drafts are
                         that drafter's last proposal, verified with the q it kept), next_by
                         (the drafter: its index in records.DRAFTING; -1: none)
    sampling  FP32  [2]  temperature, top_p
    tokens    INT32 [n]  committed tokens from the start position on, not cached yet; a
                         verification's k drafts after them

Triton batches requests with the same set of inputs only (an optional input present in one and
absent in another splits the batch: core's RequiredEqualInputs), so the drafts ride in tokens
and only draft_probs [k, V] is optional (present when a draft model outside the target
sampled). The target answers verdict INT32 [5 + m + 1 + k']: the number of drafts
accepted m, the in-target drafter's time in microseconds, 1 if it failed, the most drafts a
row of the verification's batch carried, the drafter's steps over its batch, then the m accepted
drafts and the target's own token, then the drafter's k' drafts for the next round. The draft
answers draft_tokens [k] and, when asked, draft_probs. Unsigned 64-bit values travel as the
int64 with the same bits.
"""
from __future__ import annotations

import numpy as np

from .. import names
from ..records import DRAFTING, Failure, ProposeCall, Proposer, SamplingParams, Verdict, VerifyCall

_SEQ, _START, _K, _TOP_K, _SEED, _RELEASE, _NEXT_K, _IN_TARGET, _NEXT_BY = range(9)
_FIELDS = 9
_U64 = 1 << 64


def _signed(v: int) -> int:
    return v - _U64 if v >= 1 << 63 else v


def _unsigned(v: int) -> int:
    return v % _U64


def _inputs(seq_id: int, start: int, tokens: list[int], k: int, s: SamplingParams,
            release: bool = False, next_k: int | None = None, in_target: bool = False,
            next_by: Proposer | None = None) -> dict[str, np.ndarray]:
    return {
        names.CALL: np.array([[_signed(seq_id), start, k, s.top_k, _signed(s.seed), release,
                               -1 if next_k is None else next_k, in_target,
                               -1 if next_by is None else DRAFTING.index(next_by)]], np.int64),
        names.SAMPLING: np.array([[s.temperature, s.top_p]], np.float32),
        names.TOKENS: np.array([tokens], np.int32),
    }


def propose_inputs(call: ProposeCall) -> dict[str, np.ndarray]:
    return _inputs(call.seq_id, call.start, call.tokens, call.k, call.sampling)


def verify_inputs(call: VerifyCall) -> dict[str, np.ndarray]:
    """Draft probabilities travel separately, as the draft's own output tensor (DLPack)."""
    return _inputs(call.seq_id, call.start, call.tokens + call.drafts, len(call.drafts),
                   call.sampling, False, call.next_k, call.drafts_in_target, call.next_by)


def release_inputs(seq_id: int) -> dict[str, np.ndarray]:
    return _inputs(seq_id, 0, [0], 0, SamplingParams(), release=True)


def _fields(inputs: dict) -> list[int]:
    fields = inputs[names.CALL].reshape(-1).tolist()
    if len(fields) != _FIELDS:
        raise ValueError(f"{names.CALL} has {len(fields)} values, expected {_FIELDS}")
    return fields


def sampling(inputs: dict) -> SamplingParams:
    f = _fields(inputs)
    temperature, top_p = inputs[names.SAMPLING].reshape(-1).tolist()
    return SamplingParams(float(temperature), int(f[_TOP_K]), float(top_p), _unsigned(f[_SEED]))


def is_release(inputs: dict) -> bool:
    return bool(_fields(inputs)[_RELEASE])


def sequence_id(inputs: dict) -> int:
    return _unsigned(_fields(inputs)[_SEQ])


def propose_call(inputs: dict) -> ProposeCall:
    f = _fields(inputs)
    return ProposeCall(_unsigned(f[_SEQ]), f[_START], inputs[names.TOKENS].reshape(-1).tolist(),
                       f[_K], sampling(inputs))


def verify_call(inputs: dict, draft_probs) -> VerifyCall:
    """draft_probs: a torch tensor [k, V] or None (greedy: one-hot of the drafts)."""
    f = _fields(inputs)
    tokens, k = inputs[names.TOKENS].reshape(-1).tolist(), f[_K]
    if not 0 <= k < len(tokens):
        raise ValueError(f"{names.CALL}: {k} drafts in {len(tokens)} tokens")
    n = len(tokens) - k
    return VerifyCall(_unsigned(f[_SEQ]), f[_START], tokens[:n], tokens[n:], draft_probs,
                      sampling(inputs), None if f[_NEXT_K] < 0 else f[_NEXT_K],
                      bool(f[_IN_TARGET]), None if f[_NEXT_BY] < 0 else DRAFTING[f[_NEXT_BY]])


def verdict_output(v: Verdict) -> np.ndarray:
    return np.array([[v.num_accepted, round(v.draft_s * 1e6), v.failure is not None, v.batch_k,
                      v.steps, *v.tokens, *(v.proposal or [])]], np.int32)


def verdict(output: np.ndarray) -> Verdict:
    values = output.reshape(-1).tolist()
    m, micros, failed, batch_k, steps = values[:5]
    end = 5 + m + 1
    return Verdict(values[5:end], m, values[end:] or None, micros / 1e6,
                   Failure.ERROR if failed else None, batch_k, steps)
