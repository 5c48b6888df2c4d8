"""The wire format between the orchestrator and draft_model / target_model, both directions.

A call is one Triton request with batch dimension 1; every tensor below is [1, ...]. Every
tensor is allocated, described and mapped on both sides of the Python backend's process
boundary on every call, so a call's scalars travel packed (three tensors instead of up to nine):

    call      INT64 [8]  sequence id, start position, num_draft_tokens (verify: 0), top_k,
                         seed, release (1: free the sequence's slot, nothing else),
                         next_k (verify: tokens the EAGLE-3 head drafts for the next round;
                         -1: the sequence does not use the head), drafts_from_head (1: the
                         drafts are the head's last proposal, verified with its q)
    sampling  FP32  [2]  temperature, top_p
    tokens    INT32 [n]  committed tokens from the start position on, not cached yet

The target also takes draft_tokens [k] (absent when k = 0) and draft_probs [k, V] (absent when
the draft was greedy), and answers verdict INT32 [5 + m + 1 + k']: the number of drafts
accepted m, the head's drafting time in microseconds, 1 if the head failed, the most drafts a
row of the verification's batch carried, the head's steps over its batch, then the m accepted
drafts and the target's own token, then the head's k' drafts for the next round. The draft
answers draft_tokens [k] and, when asked, draft_probs. Unsigned 64-bit values travel as the
int64 with the same bits.
"""
from __future__ import annotations

import numpy as np

from .. import names
from ..records import Failure, ProposeCall, SamplingParams, Verdict, VerifyCall

_SEQ, _START, _K, _TOP_K, _SEED, _RELEASE, _NEXT_K, _FROM_HEAD = range(8)
_FIELDS = 8
_U64 = 1 << 64


def _signed(v: int) -> int:
    return v - _U64 if v >= 1 << 63 else v


def _unsigned(v: int) -> int:
    return v % _U64


def _inputs(seq_id: int, start: int, tokens: list[int], k: int, s: SamplingParams,
            release: bool = False, next_k: int | None = None,
            from_head: bool = False) -> dict[str, np.ndarray]:
    return {
        names.CALL: np.array([[_signed(seq_id), start, k, s.top_k, _signed(s.seed), release,
                               -1 if next_k is None else next_k, from_head]], np.int64),
        names.SAMPLING: np.array([[s.temperature, s.top_p]], np.float32),
        names.TOKENS: np.array([tokens], np.int32),
    }


def propose_inputs(call: ProposeCall) -> dict[str, np.ndarray]:
    return _inputs(call.seq_id, call.start, call.tokens, call.k, call.sampling)


def verify_inputs(call: VerifyCall) -> dict[str, np.ndarray]:
    """Draft probabilities travel separately, as the draft's own output tensor (DLPack)."""
    drafts = {names.DRAFT_TOKENS: np.array([call.drafts], np.int32)} if call.drafts else {}
    return {**_inputs(call.seq_id, call.start, call.tokens, 0, call.sampling, False,
                      call.next_k, call.drafts_from_head), **drafts}


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
    drafts = inputs.get(names.DRAFT_TOKENS)
    return VerifyCall(_unsigned(f[_SEQ]), f[_START], inputs[names.TOKENS].reshape(-1).tolist(),
                      [] if drafts is None else drafts.reshape(-1).tolist(),
                      draft_probs, sampling(inputs), None if f[_NEXT_K] < 0 else f[_NEXT_K],
                      bool(f[_FROM_HEAD]))


def verdict_output(v: Verdict) -> np.ndarray:
    return np.array([[v.num_accepted, round(v.draft_s * 1e6), v.failure is not None, v.batch_k,
                      v.head_steps, *v.tokens, *(v.proposal or [])]], np.int32)


def verdict(output: np.ndarray) -> Verdict:
    values = output.reshape(-1).tolist()
    m, micros, failed, batch_k, head_steps = values[:5]
    end = 5 + m + 1
    return Verdict(values[5:end], m, values[end:] or None, micros / 1e6,
                   Failure.ERROR if failed else None, batch_k, head_steps)
