"""The wire format between the orchestrator and draft_model / target_model, both directions.

A request carries rows, one call each: a draft call, a release or a sequence's verification,
and the orchestrator sends a round's verifications as one request of many rows (bls.py), so
that the target's batch is the round's, whatever the timing of Triton's queue. Every tensor is
[rows, ...], and a call's scalars travel packed (three tensors instead of up to ten: each tensor
is allocated, described and mapped on both sides of the Python backend's process boundary on
every call):

    call      INT64 [12] sequence id, start position, num_draft_tokens k, top_k,
                         seed, release (1: free the sequence's slot, nothing else),
                         next_k (verify: tokens a drafter in the target's process drafts for
                         the next round; -1: none does), drafts_in_target (1: the drafts are
                         that drafter's last proposal, verified with the q it kept), next_by
                         (the drafter: its index in records.DRAFTING; -1: none), n (the row's
                         tokens), logprobs and prompt_logprobs (alternatives a scored token;
                         -1: not asked)
    sampling  FP32  [2]  temperature, top_p
    tokens    INT32 [n'] committed tokens from the start position on, not cached yet; a
                         verification's k drafts after them; padded with 0 to the longest row

Triton batches requests with the same set of inputs only (an optional input present in one and
absent in another splits the batch: core's RequiredEqualInputs), so the drafts ride in tokens
and only draft_probs [k, V] is optional: present when a draft model outside the target sampled,
and then in a request of one row. The target answers verdict INT32 [rows, w], a row per call
padded with 0: status (0: verified; 1: this call failed; 2: it failed and a retry may succeed,
then the message's length in bytes and its UTF-8 bytes), then for a verified call the number
of drafts accepted m, the in-target drafter's time in microseconds, 1 if it failed, the most
drafts a row of the verification's batch carried, the drafter's steps over its batch, the
committed tokens it caught up on before drafting (its batch's most), the number k' of the
drafter's drafts for the next round, the m accepted drafts and the target's own token, and the
k' drafts; then the scored tokens the call asked for, the committed tokens' and the prompt's
(_encode_scored: a count, -1 for none, and the alternatives a token, then per token its
logprob and its alternatives' ids and logprobs, each float32 as the int32 of its bits). The
draft answers draft_tokens [k] and, when asked, draft_probs.
Unsigned 64-bit values travel as the int64 with the same bits.
"""
from __future__ import annotations

import numpy as np

from .. import names
from ..records import (DRAFTING, Failure, ProposeCall, Proposer, SamplingParams, SlotError,
                       TokenLogprob, Verdict, VerifyCall)

(_SEQ, _START, _K, _TOP_K, _SEED, _RELEASE, _NEXT_K, _IN_TARGET, _NEXT_BY, _N, _LOGPROBS,
 _PROMPT_LOGPROBS) = range(12)
_FIELDS = 12
_OK, _FAILED, _RETRYABLE = range(3)
_U64 = 1 << 64


def _signed(v: int) -> int:
    return v - _U64 if v >= 1 << 63 else v


def _unsigned(v: int) -> int:
    return v % _U64


def _optional(v: int | None) -> int:
    return -1 if v is None else v


def _given(v: int) -> int | None:
    return None if v < 0 else v


def _bits(values: list[float]) -> list[int]:
    return np.array(values, np.float32).view(np.int32).tolist()


def _floats(bits: list[int]) -> list[float]:
    return np.array(bits, np.int32).view(np.float32).tolist()


def _encode_scored(scored: list[TokenLogprob] | None) -> list[int]:
    if scored is None:
        return [-1]
    top = len(scored[0].top) if scored else 0
    out = [len(scored), top]
    for lp in scored:
        out += [*_bits([lp.logprob]), *(i for i, _ in lp.top), *_bits([v for _, v in lp.top])]
    return out


def _decode_scored(values: list[int], at: int) -> tuple[list[TokenLogprob] | None, int]:
    """The scored tokens encoded from values[at], and where what follows them starts."""
    n = values[at]
    if n < 0:
        return None, at + 1
    top, at = values[at + 1], at + 2
    out = []
    for _ in range(n):
        lp, = _floats(values[at:at + 1])
        ids, logprobs = values[at + 1:at + 1 + top], _floats(values[at + 1 + top:at + 1 + 2 * top])
        out.append(TokenLogprob(lp, tuple(zip(ids, logprobs))))
        at += 1 + 2 * top
    return out, at


def _row(seq_id: int, start: int, tokens: list[int], k: int, s: SamplingParams,
         release: bool = False, next_k: int | None = None, in_target: bool = False,
         next_by: Proposer | None = None, logprobs: int | None = None,
         prompt_logprobs: int | None = None) -> tuple[list, list, list[int]]:
    call = [_signed(seq_id), start, k, s.top_k, _signed(s.seed), release, _optional(next_k),
            in_target, -1 if next_by is None else DRAFTING.index(next_by), len(tokens),
            _optional(logprobs), _optional(prompt_logprobs)]
    return call, [s.temperature, s.top_p], tokens


def _pack(rows: list[tuple[list, list, list[int]]]) -> dict[str, np.ndarray]:
    width = max(len(tokens) for _, _, tokens in rows)
    tokens = np.zeros((len(rows), width), np.int32)
    for i, (_, _, t) in enumerate(rows):
        tokens[i, :len(t)] = t
    return {names.CALL: np.array([c for c, _, _ in rows], np.int64),
            names.SAMPLING: np.array([s for _, s, _ in rows], np.float32),
            names.TOKENS: tokens}


def propose_inputs(call: ProposeCall) -> dict[str, np.ndarray]:
    return _pack([_row(call.seq_id, call.start, call.tokens, call.k, call.sampling)])


def verify_inputs(cs: list[VerifyCall]) -> dict[str, np.ndarray]:
    """One row per call. Draft probabilities travel separately, as the draft's own output
    tensor (DLPack), so a call that has them travels alone."""
    return _pack([_row(c.seq_id, c.start, c.tokens + c.drafts, len(c.drafts), c.sampling,
                       False, c.next_k, c.drafts_in_target, c.next_by, c.logprobs,
                       c.prompt_logprobs) for c in cs])


def release_inputs(seq_id: int) -> dict[str, np.ndarray]:
    return _pack([_row(seq_id, 0, [0], 0, SamplingParams(), release=True)])


def _fields(inputs: dict) -> np.ndarray:
    """[rows, 12]"""
    fields = inputs[names.CALL]
    if fields.ndim != 2 or fields.shape[1] != _FIELDS:
        raise ValueError(f"{names.CALL} has shape {list(fields.shape)}, expected "
                         f"[rows, {_FIELDS}]")
    rows = fields.shape[0]
    if rows < 1 or any(inputs[n].shape[0] != rows for n in (names.SAMPLING, names.TOKENS)):
        raise ValueError(f"{names.CALL}, {names.SAMPLING} and {names.TOKENS} differ in rows")
    return fields


def _sampling(f: list[int], sampling_row) -> SamplingParams:
    temperature, top_p = sampling_row.tolist()
    return SamplingParams(float(temperature), int(f[_TOP_K]), float(top_p), _unsigned(f[_SEED]))


def _tokens(f: list[int], tokens_row) -> list[int]:
    if not 0 <= f[_N] <= len(tokens_row):
        raise ValueError(f"{names.CALL}: {f[_N]} tokens in a row of {len(tokens_row)}")
    return tokens_row[:f[_N]].tolist()


def is_release(inputs: dict) -> bool:
    """A release travels alone: its request's first row says."""
    return bool(_fields(inputs)[0, _RELEASE])


def sequence_id(inputs: dict) -> int:
    return _unsigned(int(_fields(inputs)[0, _SEQ]))


def propose_call(inputs: dict) -> ProposeCall:
    fields = _fields(inputs)
    if len(fields) != 1:
        raise ValueError(f"a draft call is one row, not {len(fields)}")
    f = fields[0].tolist()
    return ProposeCall(_unsigned(f[_SEQ]), f[_START], _tokens(f, inputs[names.TOKENS][0]),
                       f[_K], _sampling(f, inputs[names.SAMPLING][0]))


def verify_calls(inputs: dict, draft_probs) -> list[VerifyCall | ValueError]:
    """A call per row, or the error that row's values make. draft_probs: a torch tensor
    [1, k, V] (a request of one row) or None (greedy: one-hot of the drafts)."""
    fields = _fields(inputs)
    if draft_probs is not None and len(fields) != 1:
        raise ValueError(f"{names.DRAFT_PROBS} comes with one row, not {len(fields)}")
    out: list[VerifyCall | ValueError] = []
    for i, f in enumerate(fields.tolist()):
        try:
            tokens, k = _tokens(f, inputs[names.TOKENS][i]), f[_K]
            if not 0 <= k < len(tokens):
                raise ValueError(f"{names.CALL}: {k} drafts in {len(tokens)} tokens")
        except ValueError as exc:
            out.append(exc)
            continue
        n = len(tokens) - k
        out.append(VerifyCall(_unsigned(f[_SEQ]), f[_START], tokens[:n], tokens[n:],
                              None if draft_probs is None else draft_probs[0],
                              _sampling(f, inputs[names.SAMPLING][i]),
                              _given(f[_NEXT_K]), bool(f[_IN_TARGET]),
                              None if f[_NEXT_BY] < 0 else DRAFTING[f[_NEXT_BY]],
                              _given(f[_LOGPROBS]), _given(f[_PROMPT_LOGPROBS])))
    return out


def verdict_output(rows: list[Verdict | tuple[str, bool]]) -> np.ndarray:
    """[rows, w]: a verdict, or a failed call's (message, retryable)."""
    encoded = []
    for v in rows:
        if isinstance(v, Verdict):
            proposal = v.proposal or []
            encoded.append([_OK, v.num_accepted, round(v.draft_s * 1e6), v.failure is not None,
                            v.batch_k, v.steps, v.fed, len(proposal), *v.tokens, *proposal,
                            *_encode_scored(v.logprobs), *_encode_scored(v.prompt_logprobs)])
        else:
            message, retryable = v
            data = message.encode()
            encoded.append([_RETRYABLE if retryable else _FAILED, len(data), *data])
    out = np.zeros((len(encoded), max(len(r) for r in encoded)), np.int32)
    for i, r in enumerate(encoded):
        out[i, :len(r)] = r
    return out


def verdicts(output: np.ndarray) -> list[Verdict | SlotError]:
    """A verdict per row, or the failure of that row's call (`unavailable`: retryable)."""
    out: list[Verdict | SlotError] = []
    for values in output.reshape(len(output), -1).tolist():
        if values[0] != _OK:
            message = bytes(values[2:2 + values[1]]).decode(errors="replace")
            out.append(SlotError(message, unavailable=values[0] == _RETRYABLE))
            continue
        m, micros, failed, batch_k, steps, fed, n_next = values[1:8]
        end = 8 + m + 1
        scored, at = _decode_scored(values, end + n_next)
        prompt_scored, _ = _decode_scored(values, at)
        out.append(Verdict(values[8:end], m, values[end:end + n_next] or None, micros / 1e6,
                           Failure.ERROR if failed else None, batch_k, steps, fed, scored,
                           prompt_scored))
    return out
