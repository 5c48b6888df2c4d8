"""Glue shared by the model.py files. `pb` is triton_python_backend_utils, passed in by them."""
from __future__ import annotations

import logging

import numpy as np

from .. import names
from ..runtime.config import CheckpointError
from ..records import SlotError
from .requests import InvalidInput

log = logging.getLogger("specdec")


class ModelCallError(RuntimeError):
    """A BLS call failed; `unavailable` when the model was out of sequence slots."""

    def __init__(self, message: str, unavailable: bool = False):
        super().__init__(message)
        self.unavailable = unavailable


def read_inputs(pb, request, input_names) -> dict[str, np.ndarray]:
    """The request's CPU inputs among `input_names` as numpy arrays; absent ones are left out."""
    out = {}
    for name in input_names:
        t = pb.get_input_tensor_by_name(request, name)
        if t is not None:
            out[name] = t.as_numpy()
    return out


def triton_error(pb, exc: BaseException):
    """Map our exceptions to Triton error codes: INVALID_ARG, UNAVAILABLE (retryable; the
    message carries names.UNAVAILABLE), INTERNAL."""
    codes = pb.TritonError
    message = str(exc)
    if isinstance(exc, InvalidInput):
        code = codes.INVALID_ARG
    elif getattr(exc, "unavailable", False):
        code = codes.UNAVAILABLE
        if names.UNAVAILABLE not in message:   # not already said by the model it came from
            message = f"{names.UNAVAILABLE} {message}"
    else:
        code = codes.INTERNAL
        if not isinstance(exc, (SlotError, ModelCallError, CheckpointError)):
            log.exception("request failed", exc_info=exc)
    return pb.TritonError(message, code)


def error_response(pb, exc: BaseException):
    return pb.InferenceResponse(output_tensors=[], error=triton_error(pb, exc))


def parameters(model_config: dict) -> dict:
    return model_config.get("parameters", {}) or {}
