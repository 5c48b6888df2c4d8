"""`specdec openai`: serve the OpenAI API (docs/openai.md).

    specdec openai [--grpc-url 127.0.0.1:8001] [--host 127.0.0.1] [--port 9000]
                   [--tokenizer DIR] [--served-model-name NAME]

Loopback by default, like the launcher. It calls the speculative_decoding model with token ids
(so that a client that leaves stops its generation) and tokenizes with the served target's
tokenizer: the target model's directory unless --tokenizer or $SPECDEC_TOKENIZER says otherwise,
read with no remote code. The request limits and the shutdown grace period are the server's
`SPECDEC_*` settings (limits.py, serving/shutdown.py). `make serve` starts it beside tritonserver
on port 9000.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .. import names


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--grpc-url", default="127.0.0.1:8001",
                    help="the Triton server's gRPC address. Default 127.0.0.1:8001")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (0.0.0.0: every interface). Default 127.0.0.1")
    ap.add_argument("--port", type=int, default=9000, help="Default 9000")
    ap.add_argument("--tokenizer", default=None,
                    help="the served target's tokenizer directory (prompts, stop words, text and "
                         "chat templates). Default: $SPECDEC_TOKENIZER, else "
                         "$SPECDEC_TARGET_MODEL, else the embedded default target")
    ap.add_argument("--served-model-name", default=None,
                    help="the model name clients ask for. Default: the tokenizer directory's "
                         "name")
    ap.add_argument("--triton-model", default=names.ORCHESTRATOR,
                    help="the orchestrator model to call (token ids in and out). Default "
                         f"{names.ORCHESTRATOR}")
    ap.add_argument("--log-level", default="info",
                    choices=("critical", "error", "warning", "info", "debug"))
    ap.add_argument("--access-log", action="store_true", help="log every request")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from ..serving.settings import tokenizer_path
    from ..launcher.shutdown import grace_s
    from ..serving.tokenizer import load_tokenizer
    from .app import create_app
    from .limits import Limits
    from .tools import choose
    from .triton import SpecDecoding

    limits, grace = Limits.read(), grace_s()   # the server's SPECDEC_* settings, as it reads them
    path = args.tokenizer or tokenizer_path({})
    served = args.served_model_name or Path(path).resolve().name
    tokenizer = load_tokenizer(path, torch_free=True)   # this process never needs torch
    app = create_app(SpecDecoding(args.grpc_url, tokenizer, args.triton_model, limits.request),
                     tokenizer, served, limits)
    print(f"specdec openai: http://{args.host}:{args.port}/v1 serving '{served}' (Triton "
          f"{args.grpc_url}, model {args.triton_model}; chat template: "
          f"{'yes' if getattr(tokenizer, 'chat_template', None) else 'none'}; tool calls read "
          f"as: {choose(limits.gateway.tool_parser, tokenizer)})", flush=True)
    # After SIGTERM uvicorn closes the port (new requests are refused) and lets the requests
    # under way finish for the server's own grace period, then cancels what is left.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                access_log=args.access_log, timeout_graceful_shutdown=grace)
    return 0
