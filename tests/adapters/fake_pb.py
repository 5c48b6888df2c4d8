"""A small stand-in for Triton's `triton_python_backend_utils`, enough for specdec.serving.

Only the API surface the adapters use, with the real one's strictness where it is cheap:
tensors must be numpy arrays of a Triton dtype (or DLPack), a response sender refuses sends
after FINAL, a BLS request is checked against the called model's config.pbtxt (names, dtypes,
ranks, required inputs) the way tritonserver checks it, and a model must answer every request.

BLS: `register(model_name, handler)` installs an in-process model (anything with
`execute(requests) -> responses`, e.g. specdec.serving.engine_model.DraftModel). Requests
issued in the same event-loop turn reach its `execute` as one list, as Triton's dynamic
batcher would group them. `reset()` forgets every registered model.
"""
from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
import torch
import torch.utils.dlpack

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

MODEL_REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"

_NUMPY_TO_TRITON = {
    np.dtype(np.bool_): "TYPE_BOOL", np.dtype(np.uint8): "TYPE_UINT8",
    np.dtype(np.uint16): "TYPE_UINT16", np.dtype(np.uint32): "TYPE_UINT32",
    np.dtype(np.uint64): "TYPE_UINT64", np.dtype(np.int8): "TYPE_INT8",
    np.dtype(np.int16): "TYPE_INT16", np.dtype(np.int32): "TYPE_INT32",
    np.dtype(np.int64): "TYPE_INT64", np.dtype(np.float16): "TYPE_FP16",
    np.dtype(np.float32): "TYPE_FP32", np.dtype(np.float64): "TYPE_FP64",
    np.dtype(object): "TYPE_STRING",
}
_TORCH_TO_TRITON = {
    torch.bool: "TYPE_BOOL", torch.uint8: "TYPE_UINT8", torch.int8: "TYPE_INT8",
    torch.int16: "TYPE_INT16", torch.int32: "TYPE_INT32", torch.int64: "TYPE_INT64",
    torch.float16: "TYPE_FP16", torch.float32: "TYPE_FP32", torch.float64: "TYPE_FP64",
    torch.bfloat16: "TYPE_BF16",
}


class TritonError:
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, \
        CANCELLED = range(8)

    def __init__(self, message: str, code: int = INTERNAL):
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self):
        return f"TritonError({self._message!r}, {self._code})"


class Tensor:
    """Holds a copy of a numpy array, or (from DLPack) a torch tensor without a copy."""

    def __init__(self, name: str, array):
        if not isinstance(name, str):
            raise TypeError(f"tensor name must be str, got {type(name).__name__}")
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{name}: pb_utils.Tensor takes a numpy array, got {type(array).__name__}")
        if array.dtype not in _NUMPY_TO_TRITON:
            raise TypeError(f"{name}: numpy dtype {array.dtype} has no Triton type")
        if array.dtype == object and not all(isinstance(v, (bytes, str)) for v in array.flat):
            raise TypeError(f"{name}: a BYTES tensor holds bytes or str")
        self._name, self._numpy, self._torch = name, np.array(array, copy=True), None

    @classmethod
    def from_dlpack(cls, name: str, capsule) -> "Tensor":
        t = cls.__new__(cls)
        t._name, t._numpy, t._torch = name, None, torch.from_dlpack(capsule)
        if t._torch.dtype not in _TORCH_TO_TRITON:
            raise TypeError(f"{name}: torch dtype {t._torch.dtype} has no Triton type")
        return t

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._torch is not None:
            if self._torch.device.type != "cpu":
                raise RuntimeError(f"{self._name}: as_numpy() of a tensor on {self._torch.device}")
            return self._torch.numpy()
        return self._numpy

    def to_dlpack(self):
        if self._torch is not None:
            return torch.utils.dlpack.to_dlpack(self._torch)
        if self._numpy.dtype == object:
            raise RuntimeError(f"{self._name}: a BYTES tensor has no DLPack form")
        return torch.utils.dlpack.to_dlpack(torch.from_numpy(self._numpy))

    def is_cpu(self) -> bool:
        return self._torch is None or self._torch.device.type == "cpu"

    def triton_dtype(self) -> str:
        if self._torch is not None:
            return _TORCH_TO_TRITON[self._torch.dtype]
        return _NUMPY_TO_TRITON[self._numpy.dtype]

    def shape(self) -> list[int]:
        return list(self._torch.shape if self._torch is not None else self._numpy.shape)


class InferenceResponse:
    def __init__(self, output_tensors=None, error: TritonError | None = None):
        tensors = list(output_tensors or [])
        if not all(isinstance(t, Tensor) for t in tensors):
            raise TypeError("output_tensors must be pb_utils.Tensor objects")
        names = [t.name() for t in tensors]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate output tensors: {names}")
        if error is not None and not isinstance(error, TritonError):
            raise TypeError("error must be a pb_utils.TritonError")
        self._tensors, self._error = tensors, error

    def output_tensors(self) -> list[Tensor]:
        return list(self._tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def _find(tensors, name: str) -> Tensor | None:
    return next((t for t in tensors if t.name() == name), None)


def get_input_tensor_by_name(request, name: str) -> Tensor | None:
    return _find(request.inputs(), name)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return _find(response.output_tensors(), name)


# ---------------------------------------------------------------- custom metrics

class Metric:
    def __init__(self, family: "MetricFamily", labels: dict, buckets):
        self.family, self.labels, self.buckets = family, dict(labels), buckets
        self._value = 0.0
        self.history: list[float] = []        # every value a gauge was set to (tests)
        self.observations: list[float] = []   # every value a histogram observed (tests)

    def _kind(self, *allowed, op):
        if self.family.kind not in allowed:
            raise RuntimeError(f"{self.family.name}: {op}() on a {self.family.kind}")

    def increment(self, value) -> None:
        self._kind(MetricFamily.COUNTER, MetricFamily.GAUGE, op="increment")
        if self.family.kind == MetricFamily.COUNTER and value < 0:
            raise RuntimeError(f"{self.family.name}: a counter cannot decrease")
        self._value += value

    def set(self, value) -> None:
        self._kind(MetricFamily.GAUGE, op="set")
        self._value = float(value)
        self.history.append(value)

    def observe(self, value) -> None:
        self._kind(MetricFamily.HISTOGRAM, op="observe")
        self.observations.append(float(value))

    def value(self) -> float:
        self._kind(MetricFamily.COUNTER, MetricFamily.GAUGE, op="value")
        return self._value


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = "COUNTER", "GAUGE", "HISTOGRAM"
    _NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")

    def __init__(self, name: str, description: str, kind):
        if not self._NAME.match(name):
            raise ValueError(f"invalid metric family name {name!r}")
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise ValueError(f"{name}: unknown metric kind {kind!r}")
        self.name, self.description, self.kind = name, description, kind
        self.metrics: list[Metric] = []
        _families.append(self)

    def Metric(self, labels=None, buckets=None) -> Metric:   # noqa: N802 (Triton's name)
        if (buckets is not None) != (self.kind == self.HISTOGRAM):
            raise ValueError(f"{self.name}: buckets are for histograms, and required there")
        if buckets is not None and list(buckets) != sorted(buckets):
            raise ValueError(f"{self.name}: buckets must increase")
        m = Metric(self, labels or {}, buckets)
        self.metrics.append(m)
        return m


_families: list[MetricFamily] = []


def metrics(name: str, **labels) -> list[Metric]:
    """Every metric of the families called `name` whose labels include `labels` (tests)."""
    return [m for f in _families if f.name == name for m in f.metrics
            if all(m.labels.get(k) == v for k, v in labels.items())]


# ---------------------------------------------------------------- config.pbtxt checks

class ModelConfig:
    """The input/output declarations of model_repository/<name>/config.pbtxt."""
    _ENTRY = re.compile(r'\{\s*name:\s*"(\w+)"\s*data_type:\s*(\w+)\s*dims:\s*\[([^\]]*)\]([^}]*)\}')

    def __init__(self, name: str, repository: Path = MODEL_REPOSITORY):
        text = (repository / name / "config.pbtxt").read_text()
        self.name = name
        self.max_batch_size = int(re.search(r"max_batch_size:\s*(\d+)", text).group(1))
        self.inputs = self._section(text, "input")
        self.outputs = self._section(text, "output")
        # `parameters` as Triton hands them to the backend in args["model_config"].
        self.parameters = {k: {"string_value": v} for k, v in re.findall(
            r'parameters:\s*\{\s*key:\s*"(\w+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"', text)}

    def args(self) -> dict:
        """TritonPythonModel.initialize's `args` for this model."""
        import json
        return {"model_name": self.name, "model_version": "1",
                "model_config": json.dumps({"name": self.name, "parameters": self.parameters})}

    def _section(self, text: str, key: str) -> dict[str, tuple[str, list[int], bool]]:
        body = re.search(rf"^{key}\s*\[(.*?)^\]", text, re.S | re.M).group(1)
        return {m[0]: (m[1], [int(d) for d in m[2].replace(",", " ").split()], "optional: true" in m[3])
                for m in self._ENTRY.findall(body)}

    def _check(self, what: str, decl: dict, tensors: list[Tensor]) -> None:
        for t in tensors:
            if t.name() not in decl:
                raise ValueError(f"{self.name}: unexpected {what} {t.name()!r}")
            dtype, dims, _ = decl[t.name()]
            if t.triton_dtype() != dtype:
                raise ValueError(f"{self.name}: {what} {t.name()!r} is {t.triton_dtype()}, "
                                 f"config.pbtxt says {dtype}")
            shape, want = t.shape(), ([-1] if self.max_batch_size else []) + dims
            if len(shape) != len(want) or any(w != -1 and s != w for s, w in zip(shape, want)):
                raise ValueError(f"{self.name}: {what} {t.name()!r} has shape {shape}, "
                                 f"config.pbtxt says {want}")
            if self.max_batch_size and shape[0] > self.max_batch_size:
                raise ValueError(f"{self.name}: batch {shape[0]} > max_batch_size")

    def check_inputs(self, tensors: list[Tensor]) -> None:
        self._check("input", self.inputs, tensors)
        given = {t.name() for t in tensors}
        missing = [n for n, (_, _, optional) in self.inputs.items() if not optional and n not in given]
        if missing:
            raise ValueError(f"{self.name}: missing required inputs {missing}")

    def check_outputs(self, tensors: list[Tensor]) -> None:
        self._check("output", self.outputs, tensors)


# ---------------------------------------------------------------- BLS

class _Model:
    def __init__(self, handler, config: ModelConfig | None):
        self.handler, self.config = handler, config
        self.pending: list[tuple["InferenceRequest", asyncio.Future]] = []
        self.batches: list[int] = []   # requests in each execute() call, for tests
        self.rows: list[int] = []      # and rows: the sum of their batch dimensions

    def submit(self, request: "InferenceRequest") -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.pending.append((request, fut))
        if len(self.pending) == 1:
            loop.call_soon(self.flush)
        return fut

    def flush(self) -> None:
        batch, self.pending = self.pending, []
        requests = [r for r, _ in batch]
        self.batches.append(len(requests))
        self.rows.append(sum(r.inputs()[0].shape()[0] if r.inputs() else 1 for r in requests))
        try:
            responses = self.handler.execute(requests)
            if not isinstance(responses, list) or len(responses) != len(requests):
                raise AssertionError(f"execute() of {len(requests)} requests returned {responses!r}")
            for r in responses:
                if not isinstance(r, InferenceResponse):
                    raise AssertionError(f"execute() returned {r!r}, not an InferenceResponse")
                if self.config is not None and not r.has_error():
                    self.config.check_outputs(r.output_tensors())
        except AssertionError as e:    # a broken model: the test must fail loudly
            for _, fut in batch:
                fut.set_exception(e)
            return
        except Exception as e:         # tritonserver turns a raising execute() into errors
            responses = [InferenceResponse(error=TritonError(str(e), TritonError.INTERNAL))] * len(batch)
        for (request, fut), response in zip(batch, responses):
            if not fut.cancelled():
                fut.set_result(request._only_requested(response))


_models: dict[str, _Model] = {}
before_exec = None  # optional async hook(request) awaited before a BLS request is queued


def register(model_name: str, handler, config: ModelConfig | None = None) -> _Model:
    _models[model_name] = model = _Model(handler, config)
    return model


def reset() -> None:
    global before_exec
    _models.clear()
    _families.clear()
    before_exec = None


class _Request:
    def __init__(self, inputs, requested_output_names=()):
        tensors = list(inputs)
        if not all(isinstance(t, Tensor) for t in tensors):
            raise TypeError("inputs must be pb_utils.Tensor objects")
        names = [t.name() for t in tensors]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate input tensors: {names}")
        self._inputs, self._requested = tensors, list(requested_output_names)

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def requested_output_names(self) -> list[str]:
        return list(self._requested)

    def _only_requested(self, response: InferenceResponse) -> InferenceResponse:
        if response.has_error() or not self._requested:
            return response
        return InferenceResponse([t for t in response.output_tensors() if t.name() in self._requested])


class InferenceRequest(_Request):
    """A BLS request to another model of the (fake) server."""

    def __init__(self, model_name: str, inputs, requested_output_names, **kwargs):
        super().__init__(inputs, requested_output_names)
        self.model_name = model_name

    def _model(self) -> _Model:
        if self.model_name not in _models:
            raise AssertionError(f"no model {self.model_name!r} registered with fake_pb")
        return _models[self.model_name]

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse:
        model = self._model()
        if model.config is not None:
            try:
                model.config.check_inputs(self._inputs)
                unknown = [n for n in self._requested if n not in model.config.outputs]
                if unknown:
                    raise ValueError(f"{self.model_name}: unknown requested outputs {unknown}")
            except ValueError as e:
                return InferenceResponse(error=TritonError(str(e)))
        if before_exec is not None:
            await before_exec(self)
        return _bls_answer(await model.submit(self))


def _bls_answer(response: InferenceResponse) -> InferenceResponse:
    """What the calling model sees: Triton 2.51's Python backend rebuilds a BLS response's error
    from its message alone (request_executor.cc), so its code is always INTERNAL."""
    if response.has_error():
        response = InferenceResponse(response.output_tensors(),
                                     TritonError(response.error().message()))
    return response


# ---------------------------------------------------------------- decoupled top-level requests

class ResponseSender:
    def __init__(self, config: ModelConfig | None = None, on_send=None):
        self.config, self.on_send = config, on_send
        self.sent: list[tuple[InferenceResponse | None, int]] = []
        self.closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self.closed:
            raise RuntimeError("Unable to send response. Response sender has been closed.")
        if response is None and flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise RuntimeError("a response sender needs a response or the FINAL flag")
        if response is not None:
            if not isinstance(response, InferenceResponse):
                raise TypeError(f"send() of {response!r}")
            if self.config is not None and not response.has_error():
                self.config.check_outputs(response.output_tensors())
        self.sent.append((response, flags))
        self.closed = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if self.on_send is not None:
            self.on_send(response, flags)

    # Test helpers.
    def responses(self) -> list[InferenceResponse]:
        return [r for r, _ in self.sent if r is not None]

    def finals(self) -> int:
        return sum(1 for _, f in self.sent if f & TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class Request(_Request):
    """A request as Triton hands it to a model's execute(); decoupled models use its sender.

    inputs: {name: numpy array}. cancelled: a callable (sender -> bool) for is_cancelled().
    """

    def __init__(self, inputs: dict, requested_output_names=(), config: ModelConfig | None = None,
                 cancelled=None, on_send=None):
        tensors = [Tensor(n, v) for n, v in inputs.items()]
        if config is not None:
            config.check_inputs(tensors)
        super().__init__(tensors, requested_output_names)
        self.sender = ResponseSender(config, on_send)
        self._cancelled = cancelled

    def get_response_sender(self) -> ResponseSender:
        return self.sender

    def is_cancelled(self) -> bool:
        return bool(self._cancelled and self._cancelled(self.sender))
