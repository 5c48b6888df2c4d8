"""Locust load test for the speculative-decoding ensemble: HTTP SSE, gRPC and OpenAI users.

    locust -f loadtest/locustfile.py --headless -u 4 -r 4 -t 30s \\
        --host http://127.0.0.1:8000 --grpc-host 127.0.0.1:8001 \\
        --num-draft-tokens 4,0 --max-tokens 64 --sampled-ratio 0.5 \\
        --csv reports/loadtest --html reports/loadtest.html

Every request streams. Besides the request itself (type SSE, gRPC or OpenAI: total latency,
output tokens as its "size", failures), each successful request adds entries of these types, all
named
"K=<num_draft_tokens> <greedy|sampled>":

    TTFT     time to first token, ms (one per request)
    ITL      inter-token latency: the gap between consecutive streamed chunks, ms (one per gap)
    TPOT     time per output token after the first, (total - TTFT) / (tokens - 1), ms
    TOK/S    output tokens per second over the whole request (a rate, not ms)
    ACCEPT%  the server's draft acceptance rate in percent (K > 0 only)

A request fails when the server answers an error, the stream breaks or times out, or it ends
with no output token or no text for a reason other than EOS or a stop word (a sampled request may
draw EOS first: that answer is correct and counts, without TTFT). See docs/loadtest.md.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import logging
import random
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

# gRPC's C core must yield to gevent (locust has monkey-patched the standard library by now)
# or one user's blocking stream read would stall every other user.
import gevent
import grpc.experimental.gevent as grpc_gevent
from locust import User, events, task

grpc_gevent.init_gevent()

# locust imports this file by path: make the repository root importable for loadtest.prompts.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtest import exits, outcome  # noqa: E402
from loadtest.grpc_stream import GrpcStreamer  # noqa: E402
from loadtest.openai_stream import OpenAIStreamer  # noqa: E402
from loadtest.prompts import Mix, RequestPlan, load_prompts, parse_k_list  # noqa: E402
from specdec_client import GenerationParams, Result, generate_stream  # noqa: E402

log = logging.getLogger("loadtest")

DEFAULT_HOST = "http://127.0.0.1:8000"
REQUEST_TYPES = ("SSE", "gRPC", "OpenAI")

# Filled from the command line by on_init(); shared by all users (one gevent thread).
STATE: dict = {}


@events.init_command_line_parser.add_listener
def add_arguments(parser) -> None:
    g = parser.add_argument_group("triton-specdec", "Speculative-decoding load test options")
    g.add_argument("--num-draft-tokens", type=str, default="auto",
                   help="K (auto: the server chooses per round), or a comma-separated list "
                        "cycled over requests (e.g. auto,4,0 compares the adaptive policy, a "
                        "fixed K and target-only decoding in one run). Default auto")
    g.add_argument("--max-tokens", type=int, default=64,
                   help="max_tokens of every request. Default 64")
    g.add_argument("--sampled-ratio", type=float, default=0.5,
                   help="fraction of requests that sample (the rest are greedy). Default 0.5")
    g.add_argument("--temperature", type=float, default=0.8,
                   help="temperature of the sampled requests. Default 0.8")
    g.add_argument("--top-p", type=float, default=0.95,
                   help="top_p of the sampled requests. Default 0.95")
    g.add_argument("--top-k", type=int, default=0,
                   help="top_k of the sampled requests, 0 = off. Default 0")
    g.add_argument("--prompts", type=str, default="",
                   help="prompt file (.jsonl of {\"prompt\": ...} or strings, or a .json list); "
                        "'builtin' for the built-in code prompts. Default: "
                        "models/default/heldout_prompts.jsonl if present, else built-in")
    g.add_argument("--max-prompts", type=int, default=0,
                   help="use only the first N prompts, 0 = all. Default 0")
    g.add_argument("--prompt-max-chars", type=int, default=0,
                   help="keep only the last N characters of each prompt, 0 = whole. Default 0")
    g.add_argument("--mix-seed", type=int, default=None,
                   help="seed for the prompt / greedy-or-sampled / sampling-seed draws")
    g.add_argument("--grpc-host", type=str, default="",
                   help="gRPC address host:port. Default: --host's host, its port + 1")
    g.add_argument("--http-weight", type=int, default=1,
                   help="weight of HTTP SSE users, 0 = none. Default 1")
    g.add_argument("--grpc-weight", type=int, default=1,
                   help="weight of gRPC streaming users, 0 = none. Default 1")
    g.add_argument("--openai-weight", type=int, default=0,
                   help="weight of users streaming over the OpenAI endpoint (specdec openai), "
                        "0 = none. Default 0")
    g.add_argument("--openai-host", type=str, default="",
                   help="the OpenAI endpoint's base URL. Default: --host's host, port 9000")
    g.add_argument("--openai-api", choices=("chat", "completions"), default="chat",
                   help="stream chat completions (the prompt as a user message, through the "
                        "model's chat template) or completions. Default chat")
    g.add_argument("--openai-model", type=str, default="",
                   help="the model name to ask for. Default: the first of /v1/models")
    g.add_argument("--request-timeout", type=float, default=120.0,
                   help="seconds to wait for each streamed response. Default 120")
    g.add_argument("--think-time", type=float, default=0.0,
                   help="seconds each user waits between its requests. Default 0")
    g.add_argument("--failure-backoff", type=float, default=0.5,
                   help="seconds a user waits after a failed request. Default 0.5")
    g.add_argument("--cancel-ratio", type=float, default=0.0,
                   help="fraction of requests the client cancels mid-stream, after 1 to 4 "
                        "pieces (a success named '... cancelled'). Default 0")
    g.add_argument("--exit-watchdog", type=float, default=30.0,
                   help="seconds locust's quit listeners may take after its results are written "
                        "before it prints what they wait on and leaves with its exit code. "
                        "Default 30")
    g.add_argument("--allow-remote", action="store_true", default=False,
                   help="allow a non-loopback --host/--grpc-host (refused by default)")


def _is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _fail(message: str) -> None:
    log.error(message)
    sys.exit(2)


def _openai_url(http_url: str, openai_host: str) -> str:
    if openai_host:
        return openai_host.rstrip("/") if "://" in openai_host else "http://" + openai_host
    parts = urlsplit(http_url if "://" in http_url else "http://" + http_url)
    host = parts.hostname or "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:9000"


def _grpc_address(http_url: str, grpc_host: str) -> str:
    if grpc_host:
        return grpc_host.split("://", 1)[-1].rstrip("/")
    parts = urlsplit(http_url if "://" in http_url else "http://" + http_url)
    host = parts.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{(parts.port or 80) + 1}"


# Once its results are written locust must exit: exits.py bounds the teardown that hung in CI.
@events.quit.add_listener
def _bounded_exit(exit_code: int, **_kwargs) -> None:
    exits.start_watchdog(exit_code, STATE.get("exit_watchdog", 30.0))


def _leave(exit_code: int, **_kwargs) -> None:
    exits.leave(exit_code)


@events.init.add_listener
def on_init(environment, **_kwargs) -> None:
    gevent.signal_handler(signal.SIGUSR1, exits.print_run_info)
    opts = environment.parsed_options
    if opts is None:  # locust used as a library without our options
        return
    events.quit.add_listener(_leave)   # the last: after those the locustfiles added
    host = environment.host or DEFAULT_HOST
    environment.host = host
    grpc_addr = _grpc_address(host, opts.grpc_host)
    openai_url = _openai_url(host, opts.openai_host)
    if not opts.allow_remote:
        http_name = urlsplit(host if "://" in host else "http://" + host).hostname
        grpc_name = urlsplit("//" + grpc_addr).hostname
        openai_name = urlsplit(openai_url).hostname
        for what, name in (("--host", http_name), ("--grpc-host", grpc_name),
                           ("--openai-host", openai_name)):
            if not _is_loopback(name):
                _fail(f"{what} {name!r} is not a loopback address (pass --allow-remote to "
                      f"load-test another machine)")
    try:
        draft_tokens = parse_k_list(opts.num_draft_tokens, "--num-draft-tokens")
        prompts = load_prompts(opts.prompts or None, opts.max_prompts, opts.prompt_max_chars)
        mix = Mix(prompts, draft_tokens, opts.max_tokens, opts.sampled_ratio, opts.temperature,
                  opts.top_p, opts.top_k, random.Random(opts.mix_seed), opts.cancel_ratio)
        GenerationParams(max_tokens=opts.max_tokens, temperature=opts.temperature,
                         top_p=opts.top_p, top_k=opts.top_k)  # same checks as every request
    except (OSError, ValueError, TypeError) as e:
        _fail(f"bad load-test option: {e}")
    if min(opts.http_weight, opts.grpc_weight, opts.openai_weight) < 0:
        _fail("--http-weight, --grpc-weight and --openai-weight must be >= 0")
    if opts.request_timeout <= 0 or opts.think_time < 0 or opts.failure_backoff < 0:
        _fail("--request-timeout must be > 0, --think-time and --failure-backoff >= 0")

    HttpStreamUser.weight = opts.http_weight
    GrpcStreamUser.weight = opts.grpc_weight
    OpenAIStreamUser.weight = opts.openai_weight
    kept = [u for u in environment.user_classes if u.weight > 0 or u.fixed_count > 0]
    if not kept:
        _fail("no users to run: --http-weight, --grpc-weight and --openai-weight are all 0")
    environment.user_classes[:] = kept

    STATE.update(mix=mix, grpc=grpc_addr, timeout=opts.request_timeout, think=opts.think_time,
                 backoff=opts.failure_backoff, openai=openai_url, openai_api=opts.openai_api,
                 openai_model=opts.openai_model or None, exit_watchdog=opts.exit_watchdog)
    log.info("load test: HTTP %s, gRPC %s, OpenAI %s, K %s, max_tokens %d, sampled ratio %.2f, "
             "%d prompts, users %s", host, grpc_addr, openai_url, draft_tokens, opts.max_tokens,
             opts.sampled_ratio, len(prompts), [u.__name__ for u in kept])


def params_of(plan: RequestPlan) -> GenerationParams:
    if plan.sampled:
        return GenerationParams(max_tokens=plan.max_tokens, temperature=plan.temperature,
                                top_p=plan.top_p, top_k=plan.top_k, seed=plan.seed,
                                num_draft_tokens=plan.num_draft_tokens)
    return GenerationParams(max_tokens=plan.max_tokens, temperature=0.0,
                            num_draft_tokens=plan.num_draft_tokens)


class RequestFailed(Exception):
    """A failed request as locust lists it: the cause's type and message, without the per-request
    id Triton puts in its messages (which would make every failure a separate row)."""

    def __init__(self, cause: BaseException) -> None:
        message = _REQUEST_ID.sub("", str(cause)).strip()
        super().__init__(f"{type(cause).__name__}: {message}")

    def __repr__(self) -> str:
        return str(self)


_REQUEST_ID = re.compile(r"\[request id: [^\]]*\]\s*")


def http_call(url: str, prompt: str, params: GenerationParams, timeout: float,
              cancel_after: int = 0) -> Result:
    with generate_stream(url, prompt, params, timeout=timeout) as stream:
        for i, _ in enumerate(stream, 1):
            if i == cancel_after:
                stream.cancel()
        return stream.result


def record(environment, request_type: str, plan: RequestPlan,
           call: Callable[[str, GenerationParams, float, int], Result], url: str) -> bool:
    """Run one streamed request and fire its locust statistics; False when it failed. A request
    the client cancels succeeds when it ends cancelled; it adds no stream statistics."""
    name = f"K={'auto' if plan.num_draft_tokens is None else plan.num_draft_tokens} {plan.mode}"
    name += " cancelled" if plan.cancel_after else ""
    context = {"num_draft_tokens": plan.num_draft_tokens, "mode": plan.mode}
    fire = environment.events.request.fire
    start_time = time.time()
    t0 = time.perf_counter()
    result, error = None, None
    try:
        result = call(plan.prompt, params_of(plan), STATE["timeout"], plan.cancel_after)
        outcome.check(result, cancelled=bool(plan.cancel_after))
    except Exception as e:  # ServerError, NoTokens, a broken or timed-out stream: all failures
        error = RequestFailed(e)
    elapsed_ms = (time.perf_counter() - t0) * 1000.0
    tokens = (result.num_output_tokens or 0) if result is not None else 0
    fire(request_type=request_type, name=name, response_time=elapsed_ms, response_length=tokens,
         exception=error, context=context, start_time=start_time, url=url)
    if error is not None:
        return False
    if plan.cancel_after:
        return True
    for kind, value, length in outcome.stream_metrics(result, plan.num_draft_tokens):
        fire(request_type=kind, name=name, response_time=value, response_length=length,
             exception=None, context=context, start_time=start_time, url=url)
    return True


class _StreamUser(User):
    abstract = True

    def wait_time(self) -> float:
        return STATE.get("think", 0.0)

    def after(self, ok: bool) -> None:
        # A server that fails at once would otherwise be hammered in a tight loop.
        if not ok and STATE.get("backoff", 0) > 0:
            gevent.sleep(STATE["backoff"])


class HttpStreamUser(_StreamUser):
    """Streams over HTTP generate_stream (server-sent events), via specdec_client."""

    host = DEFAULT_HOST

    @task
    def generate_stream(self) -> None:
        url = self.host
        self.after(record(self.environment, "SSE", STATE["mix"].next(),
                          lambda prompt, params, timeout, cancel_after: http_call(
                              url, prompt, params, timeout, cancel_after), url))


class GrpcStreamUser(_StreamUser):
    """Streams over gRPC (tritonclient stream_infer on one channel per user)."""

    def on_start(self) -> None:
        self.streamer = GrpcStreamer(STATE["grpc"])

    def on_stop(self) -> None:
        self.streamer.close()

    @task
    def stream_infer(self) -> None:
        plan = STATE["mix"].next()
        if plan.cancel_after and not self.streamer.cancel_is_safe():
            # A gRPC cancel can crash Triton before 2.57 (docs/reliability.md): this request
            # runs to its end, and the SSE users do the cancelling.
            if not STATE.get("warned_cancel"):
                STATE["warned_cancel"] = True
                log.warning("the server's Triton is older than 2.57, whose gRPC cancellation "
                            "can crash it: the gRPC users do not cancel (the SSE users do)")
            plan = dataclasses.replace(plan, cancel_after=0)
        self.after(record(self.environment, "gRPC", plan, self.streamer.generate, STATE["grpc"]))


class OpenAIStreamUser(_StreamUser):
    """Streams chat (or completions) over the OpenAI endpoint, through the gateway (its
    weight, 0 unless --openai-weight says otherwise, is set in on_init)."""

    def on_start(self) -> None:
        self.streamer = OpenAIStreamer(STATE["openai"], STATE["openai_model"],
                                       STATE["openai_api"], STATE["timeout"])

    def on_stop(self) -> None:
        self.streamer.close()

    @task
    def stream_chat(self) -> None:
        self.after(record(self.environment, "OpenAI", STATE["mix"].next(), self.streamer.generate,
                          STATE["openai"]))


def _k_first(name: str) -> tuple:
    """'K=auto ...' first, then larger K first."""
    k = name.split()[0][2:]
    return (0, 0, name) if k == "auto" else (1, -int(k), name)


@events.quitting.add_listener
def print_comparison(environment, **_kwargs) -> None:
    """A compact per-K / per-mode table of the streaming statistics, on stderr."""
    stats = getattr(environment, "stats", None)
    if stats is None or not stats.entries:
        return
    by_name: dict[str, dict[str, object]] = {}
    for (name, kind), entry in stats.entries.items():
        by_name.setdefault(name, {})[kind] = entry
    rows = []
    for name in sorted(by_name, key=_k_first):
        e = by_name[name]
        reqs = sum(e[t].num_requests for t in REQUEST_TYPES if t in e)
        fails = sum(e[t].num_failures for t in REQUEST_TYPES if t in e)

        def med(t: str) -> str:
            return f"{e[t].median_response_time:.0f}" if t in e and e[t].num_requests else "-"

        def avg(t: str) -> str:
            return f"{e[t].avg_response_time:.1f}" if t in e and e[t].num_requests else "-"

        rows.append((name, str(reqs), str(fails), med("TTFT"), avg("ITL"), avg("TPOT"),
                     avg("TOK/S"), avg("ACCEPT%")))
    head = ("name", "reqs", "fails", "TTFT p50 ms", "ITL avg ms", "TPOT avg ms", "tok/s avg",
            "accept %")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [head] + rows]
    print("\nSpeculative decoding summary (per K and sampling mode)\n" + "\n".join(lines),
          file=sys.stderr, flush=True)
