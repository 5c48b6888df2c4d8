"""Load-time checks across models: what one model's config.pbtxt cannot contradict in another's.

Each refusal names the field and both values, and fails `initialize`, so the server does not
start half-configured: a KV slot pool shorter than the orchestrator's context window, or two
instances of a model that keeps per-sequence state (a later call of a sequence could reach the
instance that does not hold it).
"""
from __future__ import annotations

import sys
from pathlib import Path

from .adapter import parameters
from .engine_settings import EngineSettings
from .settings import OrchestratorSettings, SettingsError

STATEFUL = ("draft_model", "target_model")
SHARED = ("max_seq_len", "max_sequences")   # the orchestrator's must equal the engines'


def say(model: str, line: str) -> None:
    """One line to tritonserver's log (a Python model's stderr), once, at load."""
    print(f"specdec {model}: {line}", file=sys.stderr, flush=True)


def cuda_line(device) -> str:
    """What a GPU's speed rests on, as this process loaded it: a stub's libraries need not be
    the shell's (LD_LIBRARY_PATH, launch.py), and without cuDNN's attention SDPA runs its math
    kernels (3.7x slower draft steps at 16 rows, H100, 2026-11-27: docs/benchmarks.md)."""
    import torch
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return (f"{torch.cuda.get_device_name(device)} ({device}), torch {torch.__version__}, CUDA "
            f"{torch.version.cuda}, cuDNN {cudnn or 'unavailable'}")


def cpu_line(engine) -> str:
    """What a CPU engine computes with: the CPU's own kernels and their threads, or PyTorch's
    operators and why."""
    from ..kernels.cpu import build
    if not engine.cpu_kernel:
        reason = build.reason() or f"not for {str(engine.dtype).removeprefix('torch.')}"
        return f"PyTorch's operators on the CPU (the CPU kernels: {reason})"
    attention = "attention" if engine.model.cpu_attention else "not attention (SDPA)"
    return (f"the CPU kernels ({build.threads()} threads): linear layers and {attention} "
            f"({build.load()._name})")


def graphs_line(engine) -> str:
    """What capturing an engine's CUDA graphs (and its head's) took at load."""
    parts = engine.graphed_forwards
    return (f"{sum(len(g.graphs) for g in parts)} CUDA graphs captured in "
            f"{sum(g.warm_s for g in parts):.1f} s")


def instance_count(model_config: dict) -> int:
    """Instances Triton starts from `instance_group` (a KIND_GPU group starts `count` per GPU
    listed). No group: one."""
    total = 0
    for group in model_config.get("instance_group") or [{}]:
        count = int(group.get("count", 1))
        gpus = group.get("gpus") or []
        total += count * (len(gpus) if group.get("kind") == "KIND_GPU" and gpus else 1)
    return total


def check_one_instance(model_config: dict, model: str) -> None:
    n = instance_count(model_config)
    if n != 1:
        raise SettingsError(
            f"{model}: instance_group count gives {n} instances, must be 1: a sequence's KV cache "
            f"lives in one instance and Triton may route its next call to another")


def read_model_config(path: Path) -> dict:
    """A config.pbtxt as Triton hands it to a backend in args["model_config"] (protobuf JSON)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2   # the serve extra's; parsed as Triton does

    try:
        message = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    except (OSError, text_format.ParseError) as e:
        raise SettingsError(f"{path}: cannot be read: {e}") from None
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def check_shared_sizes(settings: OrchestratorSettings, repository: Path) -> None:
    """speculative_decoding's max_seq_len and max_sequences against draft_model's and
    target_model's, read from their config.pbtxt with the same $SPECDEC_* overrides they apply.
    A disabled draft_model ($SPECDEC_DRAFT_MODEL=none) holds no slots and is not compared."""
    for model in STATEFUL:
        if model == "draft_model" and not settings.has_draft:
            continue
        file = repository / model / "config.pbtxt"
        theirs = EngineSettings.parse(parameters(read_model_config(file)), model.split("_")[0])
        for name in SHARED:
            ours, other = getattr(settings, name), getattr(theirs, name)
            if ours != other:
                raise SettingsError(
                    f"{name}: speculative_decoding has {ours}, {model} has {other} ({file}); "
                    f"they must be equal: set ${'SPECDEC_' + name.upper()} once for all models")
