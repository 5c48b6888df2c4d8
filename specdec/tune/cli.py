"""specdec tune --target DIR (--draft DIR | --eagle-head DIR | --self) --prompts FILE
[--url HOST:PORT] [--out FILE]"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

from ..runtime.config import CheckpointError
from ..prompts import PromptsError, encode, load_prompts
from ..serving.settings import default_pair
from .pair import check_pair


def add_arguments(ap: argparse.ArgumentParser) -> None:
    # The embedded pair as the server finds it: $SPECDEC_DEFAULT_MODELS (the image), else the
    # source checkout's models/default.
    pair = default_pair()
    ap.add_argument("--target", type=Path, default=pair / "target",
                    help="target checkpoint directory (default: the embedded pair's)")
    ap.add_argument("--draft", type=Path, default=pair / "draft")
    ap.add_argument("--eagle-head", type=Path,
                    help="tune an EAGLE-3 head of the target (either published format, or "
                         "specdec distill --method eagle3) instead of --draft; with --url, the "
                         "server's proposer=eagle")
    ap.add_argument("--self", dest="self_search", action="store_true",
                    help="search the layers the target skips to draft for itself (SWIFT) "
                         "instead of tuning --draft: prints SPECDEC_SELF_SKIP")
    ap.add_argument("--budget", type=int, default=64,
                    help="--self: skip sets to score at most (64)")
    ap.add_argument("--prompts", type=Path, default=pair / "heldout_prompts.jsonl",
                    help="JSON lines ({\"prompt\": ...} or {\"messages\": [...]}) or plain text, "
                         "one prompt per line: your own traffic, as close as you have it")
    ap.add_argument("--num-prompts", type=int, default=16, help="the first N prompts (16)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per request (64)")
    ap.add_argument("--ks", default="1,2,3,4,5,6,7,8", help="draft lengths to measure")
    ap.add_argument("--url", help="also measure a running server (gRPC host:port), K=0, each "
                                  "K and auto; its figures decide the best K")
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda")
    ap.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU)")
    ap.add_argument("--out", type=Path, default=Path("reports") / "tune.json")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    try:
        ks = sorted({int(k) for k in args.ks.split(",") if k.strip()})
        if not ks or min(ks) < 1:
            raise ValueError
    except ValueError:
        return _fail(f"--ks: expected draft lengths >= 1, comma-separated, got {args.ks!r}")
    if args.num_prompts < 1 or args.max_tokens < 1 or args.budget < 1:
        return _fail("--num-prompts, --max-tokens and --budget must be >= 1")
    if args.self_search and (args.eagle_head or args.url):
        return _fail("--self measures in process, one drafter: not with --eagle-head or --url")
    draft_dir = None if args.eagle_head or args.self_search else args.draft
    try:
        target_args, _ = check_pair(args.target, draft_dir)
        prompts = load_prompts(args.prompts, args.num_prompts)
    except (CheckpointError, PromptsError) as e:
        return _fail(str(e))

    import torch

    from ..serving.engine_settings import EngineSettings
    from .measure import load_engines, measure
    from ..records import AUTO, Proposer
    from .remote import measure_server
    from .report import analyse, markdown
    settings = EngineSettings(device=args.device, dtype=args.dtype)
    try:
        device, dtype = settings.torch_device(), settings.torch_dtype()
    except (RuntimeError, KeyError) as e:
        return _fail(f"--device/--dtype: {e}")
    if device.type == "cpu":   # the CPU kernels' threads as the server sets them
        from ..kernels.cpu import build
        build.set_threads(settings.kernel_thread_count())
    tokenizer = _tokenizer(args.target)
    ids = [encode(tokenizer, p) for p in prompts]
    max_len = min(target_args.max_position_embeddings,
                  max(len(i) for i in ids) + args.max_tokens + max(ks) + 1)
    try:
        target, draft = load_engines(args.target, draft_dir, device, dtype, max_len,
                                     target_args.vocab_size, args.eagle_head)
    except CheckpointError as e:     # a head that does not fit the target, named
        return _fail(str(e))
    if args.self_search:
        from .self_search import tune
        try:
            result, text = tune(target, ids, max(ks), args.max_tokens, target_args.eos_token_ids,
                                args.budget, _progress(args.budget, args.quiet))
        except ValueError as e:   # a target with no layer to skip, answers too short
            return _fail(str(e))
        title = _title(args, "itself, layers skipped", len(prompts), device, dtype)
        return _write(args, device, dtype, len(prompts), Proposer.SELF, result,
                      f"## {title}\n\n{text}")
    proposer = Proposer.EAGLE if args.eagle_head else Proposer.DRAFT
    server_ks = ([0] + ks + [AUTO]) if args.url else []
    bar = _progress(len(prompts) * (len(ks) + 1 + len(server_ks)), args.quiet)
    local = []
    for k in [0] + ks:
        bar.set_description(f"in process K={k}")
        local.append(measure(target, draft, ids, k, args.max_tokens, target_args.eos_token_ids,
                             lambda: bar.update(1)))
        bar.set_postfix(tok_s=f"{local[-1].tokens_per_s:.1f}")
    remote = None
    if args.url:
        texts = [p if isinstance(p, str) else tokenizer.apply_chat_template(
            p, add_generation_prompt=True, tokenize=False) for p in prompts]
        remote = []
        for k in server_ks:
            bar.set_description(f"server K={'auto' if k == AUTO else k}")
            remote.append(measure_server(args.url, texts, k, args.max_tokens,
                                         lambda: bar.update(1), proposer))
            bar.set_postfix(tok_s=f"{remote[-1].tokens_per_s:.1f}")
    bar.close()
    drafter = f"the EAGLE-3 head {args.eagle_head.name}" if args.eagle_head else args.draft.name
    result = analyse(local, remote)
    title = _title(args, drafter, len(prompts), device, dtype)
    return _write(args, device, dtype, len(prompts), proposer, result, markdown(result, title))


def _title(args, drafter: str, num_prompts: int, device, dtype) -> str:
    return (f"specdec tune: {args.target.name} with {drafter} on {num_prompts} prompts x "
            f"{args.max_tokens} tokens, {device} {str(dtype).replace('torch.', '')}")


def _write(args, device, dtype, num_prompts: int, proposer, result: dict, text: str) -> int:
    """The report JSON at --out; its text on stdout."""
    import torch
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "command": " ".join(["specdec", "tune", *sys.argv[2:]]) if sys.argv[1:2] == [
                  "tune"] else " ".join(sys.argv),
              "machine": {"cpu": platform.processor() or platform.machine(),
                          "cpu_count": os.cpu_count(), "device": str(device),
                          "gpu": torch.cuda.get_device_name(device) if device.type == "cuda"
                          else None, "dtype": str(dtype).replace("torch.", "")},
              "target": str(args.target), "proposer": proposer,
              "draft": None if args.eagle_head or args.self_search else str(args.draft),
              "eagle_head": str(args.eagle_head) if args.eagle_head else None,
              "prompts": str(args.prompts),
              "num_prompts": num_prompts, "max_tokens": args.max_tokens, "url": args.url,
              **result}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(text)
    print(f"JSON: {args.out}", file=sys.stderr)
    return 0


def _tokenizer(path: Path):
    import transformers
    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


def _progress(total: int, quiet: bool):
    from tqdm import tqdm
    return tqdm(total=total, unit="req", disable=quiet, file=sys.stderr, dynamic_ncols=True)


def _fail(message: str) -> int:
    print(f"specdec tune: {message}", file=sys.stderr)
    return 2
