"""Command line: ``python -m specdec_client [options] PROMPT``.

Text goes to stdout as it arrives so it can be piped; statistics and errors
go to stderr so they never mix with the text.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .api import generate, generate_stream, grpc_generate, grpc_stream
from .stream import TextStream
from .wire import (
    DEFAULT_GRPC_URL,
    DEFAULT_HTTP_URL,
    DEFAULT_TIMEOUT_S,
    ENSEMBLE,
    PROPOSERS,
    GenerationParams,
    Result,
    ServerError,
)

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specdec_client",
        description="Send a prompt to the speculative-decoding server on Triton.")
    p.add_argument("prompt", metavar="PROMPT", help="prompt text, or - to read it from stdin")
    p.add_argument("--url", help=f"server address (default {DEFAULT_HTTP_URL} for http, "
                                 f"{DEFAULT_GRPC_URL} for grpc)")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--model", default=ENSEMBLE, help="Triton model name (default %(default)s)")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="print text as it is generated (default on)")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--num-draft-tokens", type=int,
                   help="K per round; 0 decodes with the target model only; default: the "
                        "server chooses per round")
    p.add_argument("--proposer", choices=PROPOSERS,
                   help="draft with the draft model, prompt lookup, the EAGLE-3 head, the "
                        "target with layers skipped (self), Medusa heads, or any of them per "
                        "round; default: the server's")
    p.add_argument("--stop-word", action="append", dest="stop_words", metavar="W",
                   help="stop generating at W (repeatable)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help="seconds to wait for each response (default %(default)s)")
    return p


def params_from_args(args: argparse.Namespace) -> GenerationParams:
    """Options left unset stay None so the server's defaults apply."""
    return GenerationParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, seed=args.seed, num_draft_tokens=args.num_draft_tokens,
        stop_words=args.stop_words, proposer=args.proposer)


def _fmt(value: object, spec: str = "", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def format_stats(result: Result) -> str:
    """Two human-readable lines of statistics for stderr."""
    return (
        f"tokens: {_fmt(result.num_output_tokens)}, "
        f"draft tokens: {_fmt(result.total_draft_tokens)}, "
        f"accepted: {_fmt(result.total_accepted_draft_tokens)} "
        f"(lookup: {_fmt(result.ngram_accepted_tokens)} of {_fmt(result.ngram_draft_tokens)}), "
        f"acceptance rate: {_fmt(result.acceptance_rate, '.3f')}, "
        f"finish reason: {_fmt(result.finish_reason)}\n"
        f"time to first token: {_fmt(result.time_to_first_token_s, '.3f', ' s')}, "
        f"total time: {_fmt(result.total_time_s, '.3f', ' s')}, "
        f"tokens/s: {_fmt(result.tokens_per_s, '.1f')}"
    )


def _print_stream(stream: TextStream) -> tuple[Result, bool]:
    interrupted = False
    with stream:
        try:
            for piece in stream:
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            stream.cancel()
            interrupted = True
        return stream.wait(), interrupted


def _run(args: argparse.Namespace, prompt: str, params: GenerationParams) -> int:
    grpc = args.protocol == "grpc"
    url = args.url or (DEFAULT_GRPC_URL if grpc else DEFAULT_HTTP_URL)
    kw = {"model": args.model, "timeout": args.timeout}
    interrupted = False
    if args.stream:
        opener = grpc_stream if grpc else generate_stream
        result, interrupted = _print_stream(opener(url, prompt, params, **kw))
    else:
        result = (grpc_generate if grpc else generate)(url, prompt, params, **kw)
        sys.stdout.write(result.text)
    if result.text and not result.text.endswith("\n"):
        sys.stdout.write("\n")
    sys.stdout.flush()
    print(format_stats(result), file=sys.stderr)
    return EXIT_INTERRUPTED if interrupted else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0, 1 on error, 2 on bad usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        params = params_from_args(args)
    except (TypeError, ValueError) as e:
        parser.error(str(e))
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    try:
        return _run(args, prompt, params)
    except ServerError as e:
        print(f"error: {e}", file=sys.stderr)
    except OSError as e:
        print(f"error: cannot talk to the server: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_ERROR
