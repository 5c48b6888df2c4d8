"""What one finished streamed request adds to the load-test statistics; no locust import, so
unit tests can call it without gevent's monkey-patching."""
from __future__ import annotations

from specdec_client import Result

# Ending at once on one of these is a correct answer: a sampled row may draw EOS first.
EARLY_FINISH = ("eos", "stop")


class NoTokens(Exception):
    """The request finished without an error, not on EOS or a stop word, yet produced no output
    token (or no text)."""


class NotCancelled(Exception):
    """The client cancelled mid-stream, yet the result does not say so."""


def check(result: Result, cancelled: bool = False) -> None:
    """Raise NoTokens for an answer that is empty without a reason; NotCancelled when a request
    the client cancelled did not end cancelled (or ended on its own first: fine, it was short)."""
    if cancelled:
        if result.finish_reason not in ("cancelled",) + EARLY_FINISH + ("length",):
            raise NotCancelled(f"finish_reason {result.finish_reason!r} after a cancel")
        return
    if result.finish_reason in EARLY_FINISH:
        return
    if not result.num_output_tokens or not result.chunk_times_s:
        raise NoTokens(f"no output {'text' if result.num_output_tokens else 'tokens'} "
                       f"(finish_reason {result.finish_reason!r})")


def stream_metrics(result: Result, num_draft_tokens: int | None) -> list[tuple[str, float, int]]:
    """(type, value, length) entries of a successful request: TTFT, TPOT, ITL, TOK/S, ACCEPT%.

    An answer without tokens has no first token, no rate and, without drafts, no acceptance.
    """
    tokens = result.num_output_tokens or 0
    out: list[tuple[str, float, int]] = []
    ttft_s = result.time_to_first_token_s
    if ttft_s is not None and tokens > 0:
        out.append(("TTFT", ttft_s * 1000.0, tokens))
        if tokens > 1 and result.total_time_s > ttft_s:
            out.append(("TPOT", (result.total_time_s - ttft_s) * 1000.0 / (tokens - 1), tokens))
    out.extend(("ITL", gap_s * 1000.0, 0) for gap_s in result.inter_chunk_latencies_s)
    if result.tokens_per_s is not None:
        out.append(("TOK/S", result.tokens_per_s, tokens))
    drafted = result.total_draft_tokens or 0
    if num_draft_tokens != 0 and drafted > 0 and result.acceptance_rate is not None:
        out.append(("ACCEPT%", result.acceptance_rate * 100.0, drafted))
    return out
