"""The same prompts through a running server (gRPC streaming, the project's client): what each
K does once the models sit behind Triton's calls, the figure a deployment should be tuned on."""
from __future__ import annotations

from ..records import Proposer
from .measure import Measurement


def measure_server(url: str, prompts: list[str], k: int, max_tokens: int,
                   step=lambda: None, proposer: Proposer = Proposer.DRAFT) -> Measurement:
    try:
        from specdec_client import GenerationParams, grpc_stream
    except ImportError as e:
        raise SystemExit(f"--url needs the client: pip install 'triton-specdec[client]' ({e})")
    # One proposer, the one tuned (the draft model, or the head): a server's default, hybrid,
    # would mix in prompt lookup's proposals.
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0, num_draft_tokens=k,
                              proposer=proposer)
    grpc_stream(url, prompts[0], params).wait()           # warm-up
    m = Measurement(k)
    for p in prompts:
        r = grpc_stream(url, p, params).wait()
        m.requests += 1
        m.tokens += r.num_output_tokens or 0
        m.seconds += r.total_time_s
        m.drafted += r.total_draft_tokens or 0
        m.accepted += r.total_accepted_draft_tokens or 0
        step()
    return m
