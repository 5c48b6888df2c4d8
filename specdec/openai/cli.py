"""`specdec openai`: serve the OpenAI API (docs/openai.md).

    specdec openai [--grpc-url 127.0.0.1:8001] [--host 127.0.0.1] [--port 9000]
                   [--tokenizer DIR] [--served-model-name NAME]

Loopback by default, like the launcher; the tokenizer (for chat templates) is the target
model's directory unless --tokenizer or $SPECDEC_TOKENIZER says otherwise, read with no remote
code. `make serve` starts it beside tritonserver on port 9000.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--grpc-url", default="127.0.0.1:8001",
                    help="the Triton server's gRPC address. Default 127.0.0.1:8001")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (0.0.0.0: every interface). Default 127.0.0.1")
    ap.add_argument("--port", type=int, default=9000, help="Default 9000")
    ap.add_argument("--tokenizer", default=None,
                    help="tokenizer directory for chat templates. Default: $SPECDEC_TOKENIZER, "
                         "else $SPECDEC_TARGET_MODEL, else the embedded default target")
    ap.add_argument("--served-model-name", default=None,
                    help="the model name clients ask for. Default: the tokenizer directory's "
                         "name")
    ap.add_argument("--triton-model", default="ensemble",
                    help="the Triton model to call. Default ensemble")
    ap.add_argument("--log-level", default="info",
                    choices=("critical", "error", "warning", "info", "debug"))
    ap.add_argument("--access-log", action="store_true", help="log every request")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from ..serving.settings import tokenizer_path
    from ..serving.tokenizer import load_tokenizer
    from .app import create_app
    from .triton import Ensemble

    path = args.tokenizer or tokenizer_path({})
    served = args.served_model_name or Path(path).resolve().name
    tokenizer = load_tokenizer(path)
    app = create_app(Ensemble(args.grpc_url, args.triton_model), tokenizer, served)
    print(f"specdec openai: http://{args.host}:{args.port}/v1 serving '{served}' (Triton "
          f"{args.grpc_url}, model {args.triton_model}; chat template: "
          f"{'yes' if getattr(tokenizer, 'chat_template', None) else 'none'})", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                access_log=args.access_log, timeout_graceful_shutdown=5)
    return 0
