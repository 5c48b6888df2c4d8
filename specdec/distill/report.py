"""The run's report (distill_report.json beside the draft's weights) and its printed summary."""
from __future__ import annotations

import datetime
import os
import platform
import shlex

import torch

from ..runtime.config import ModelArgs
from .checks import parameters

ARCH = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
        "vocab_size", "tie_word_embeddings")


def command(args) -> str:
    """The run as one command line, every option spelled out (the learning rate resolved)."""
    parts = ["specdec", "distill"]
    for key, value in vars(args).items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif value is not None and value is not False:
            parts += [flag, str(value)]
    return shlex.join(parts)


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, {os.cpu_count()} CPUs"
    return f"{os.cpu_count()}-core {platform.machine()} CPU ({torch.get_num_threads()} threads)"


def model_summary(a: ModelArgs, trainable: int | None = None) -> dict:
    total, embedding = parameters(a)
    out = {k: getattr(a, k) for k in ARCH}
    out.update(parameters=total, non_embedding_parameters=total - embedding)
    if trainable is not None:
        out["trainable_parameters"] = trainable
    return out


def _common(args, target: ModelArgs, device: torch.device, sources: dict, history: list,
            final: dict) -> tuple[dict, dict, dict]:
    """What every method's report holds: (the run's header, the summary's shared figures, the
    held-out section and history), to be merged around the method's own sections."""
    per_k, best = final["per_k"], final["best_k"]
    header = {
        "command": command(args),
        "date": datetime.date.today().isoformat(),
        "machine": machine(device),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "device": str(device),
        # the run's high-water mark on the GPU (training and measurement): what it needs there
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda"
        else None,
        "target": {"path": str(args.target), **model_summary(target)},
    }
    best_figures = {"best_k": best, "a_best_k": per_k[best]["a"],
                    "predicted_speedup_best_k": per_k[best]["predicted_speedup"],
                    "c": final["c"], "c_per": final["c_per"]}
    tail = {"heldout": {"prompts": sources["heldout_prompts"],
                        "tokens_per_prompt": args.eval_tokens, "max_k": args.max_k, **final},
            "history": history}
    return header, best_figures, tail


def _training(args, seconds: float) -> dict:
    return {"steps": args.steps, "batch": args.batch, "seq_len": args.seq_len, "lr": args.lr,
            "seconds": round(seconds)}


def build(*, args, target: ModelArgs, draft: ModelArgs, init: str, trainable: int,
          device: torch.device, sources: dict, history: list, final: dict, seconds: float) -> dict:
    per_k = final["per_k"]
    losses = [h["loss"] for h in history if h.get("loss") is not None]
    header, best, tail = _common(args, target, device, sources, history, final)
    return {
        "method": args.method, **header,
        "draft": {"init": init, **model_summary(draft, trainable)},
        "data": sources,
        "training": {**_training(args, seconds), "final_loss": losses[-1] if losses else None},
        "summary": {"a_k4": per_k[4]["a"] if 4 in per_k else None,
                    "predicted_speedup_k4": per_k[4]["predicted_speedup"] if 4 in per_k else None,
                    **best},
        **tail,
    }


def build_eagle3(*, args, target: ModelArgs, aux: tuple[int, ...], used: torch.Tensor,
                 coverage: float, trainable: int, device: torch.device, sources: dict,
                 history: list, final: dict, seconds: float) -> dict:
    """The draft's report with the head in place of the draft: its aux layers, draft
    vocabulary (coverage: the share of training tokens in it), TTT steps and the loss at each
    of them."""
    trained = [h for h in history if h.get("loss") is not None]
    k4 = final["per_k"].get(4)
    header, best, tail = _common(args, target, device, sources, history, final)
    return {
        "method": "eagle3", **header,
        "head": {"format": "speculators", "aux_layers": list(aux),
                 "draft_vocab_size": len(used), "hidden_size": target.hidden_size,
                 "trainable_parameters": trainable,
                 "draft_vocab_coverage": round(coverage, 4)},
        "data": sources,
        "training": {**_training(args, seconds), "ttt_steps": args.ttt_steps,
                     "final_loss": trained[-1]["loss"] if trained else None,
                     "final_loss_by_ttt_step":
                         trained[-1]["loss_by_ttt_step"] if trained else None},
        "summary": {"a_k4": k4["a"] if k4 else None,
                    "accepted_per_round_k4": k4["accepted_per_round"] if k4 else None,
                    "tokens_per_round_k4": k4["tokens_per_round"] if k4 else None,
                    "predicted_speedup_k4": k4["predicted_speedup"] if k4 else None,
                    **best},
        **tail,
    }


def latest_a4(history: list) -> str:
    """The latest measured acceptance rate at K=4 (or the largest K measured)."""
    acc = next((e["acceptance"] for e in reversed(history) if e["acceptance"]), None)
    if not acc:
        return "-"
    row = acc["per_k"].get(4) or acc["per_k"][max(acc["per_k"])]
    return f"{row['a']:.3f}"


def summary(report: dict) -> str:
    h, first = report["heldout"], report["history"][0]["acceptance"]
    pos = " ".join(f"{p:.2f}" for p in h["acceptance_by_position"])
    before = " ".join(f"{p:.2f}" for p in first["acceptance_by_position"])
    s = report["summary"]
    return (f"held-out acceptance by position (K={h['max_k']}): {pos}\n"
            f"  before training (step {report['history'][0]['step']}):   {before}\n"
            f"c = {s['c']:.3f} per {s['c_per']} (measured on {report['device']}); K=4: "
            f"a = {s['a_k4']}, predicted "
            f"speedup {s['predicted_speedup_k4']}x; best K={s['best_k']}: a = {s['a_best_k']}, "
            f"predicted speedup {s['predicted_speedup_best_k']}x")
