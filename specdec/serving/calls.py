"""The wire format between the orchestrator and draft_model / target_model, both directions.

A call is one Triton request with batch dimension 1; every tensor below is [1, ...].
"""
from __future__ import annotations

import numpy as np

from .. import names
from ..engine import ProposeCall, VerifyCall
from ..sampling import SamplingParams


def _sampling_inputs(s: SamplingParams) -> dict[str, np.ndarray]:
    return {
        names.TEMPERATURE: np.array([[s.temperature]], np.float32),
        names.TOP_K: np.array([[s.top_k]], np.int32),
        names.TOP_P: np.array([[s.top_p]], np.float32),
        names.SEED: np.array([[s.seed]], np.uint64),
    }


def _common_inputs(seq_id: int, start: int, tokens: list[int]) -> dict[str, np.ndarray]:
    return {
        names.SEQUENCE_ID: np.array([[seq_id]], np.uint64),
        names.START_POSITION: np.array([[start]], np.int32),
        names.TOKENS: np.array([tokens], np.int32),
    }


def propose_inputs(call: ProposeCall) -> dict[str, np.ndarray]:
    return {**_common_inputs(call.seq_id, call.start, call.tokens),
            names.NUM_DRAFT_TOKENS: np.array([[call.k]], np.int32),
            **_sampling_inputs(call.sampling)}


def verify_inputs(call: VerifyCall) -> dict[str, np.ndarray]:
    """Draft probabilities travel separately, as the draft's own output tensor (DLPack)."""
    drafts = {names.DRAFT_TOKENS: np.array([call.drafts], np.int32)} if call.drafts else {}
    return {**_common_inputs(call.seq_id, call.start, call.tokens), **drafts,
            **_sampling_inputs(call.sampling)}


def release_inputs(seq_id: int) -> dict[str, np.ndarray]:
    return {**_common_inputs(seq_id, 0, [0]), names.RELEASE: np.array([[True]])}


def _scalar(inputs, name, default=None):
    v = inputs.get(name)
    return default if v is None else v.reshape(-1)[0].item()


def sampling(inputs: dict) -> SamplingParams:
    return SamplingParams(float(_scalar(inputs, names.TEMPERATURE, 0.0)),
                          int(_scalar(inputs, names.TOP_K, 0)),
                          float(_scalar(inputs, names.TOP_P, 1.0)),
                          int(_scalar(inputs, names.SEED, 0)))


def is_release(inputs: dict) -> bool:
    return bool(_scalar(inputs, names.RELEASE, False))


def sequence_id(inputs: dict) -> int:
    return int(_scalar(inputs, names.SEQUENCE_ID))


def propose_call(inputs: dict) -> ProposeCall:
    return ProposeCall(sequence_id(inputs), int(_scalar(inputs, names.START_POSITION)),
                       inputs[names.TOKENS].reshape(-1).tolist(),
                       int(_scalar(inputs, names.NUM_DRAFT_TOKENS)), sampling(inputs))


def verify_call(inputs: dict, draft_probs) -> VerifyCall:
    """draft_probs: a torch tensor [k, V] or None (greedy: one-hot of the drafts)."""
    drafts = inputs.get(names.DRAFT_TOKENS)
    return VerifyCall(sequence_id(inputs), int(_scalar(inputs, names.START_POSITION)),
                      inputs[names.TOKENS].reshape(-1).tolist(),
                      [] if drafts is None else drafts.reshape(-1).tolist(),
                      draft_probs, sampling(inputs))
