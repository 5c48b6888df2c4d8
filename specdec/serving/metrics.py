"""The speculative metrics on Triton's Prometheus endpoint (port 8002), via the Python backend.

Names are prefixed `specdec_`. Counters add up to the per-request statistics returned to
clients: sum of `total_draft_tokens` = specdec_draft_tokens_total, and so on.

Every metric update is a message from the backend stub to the server process. Counter
increments are therefore summed here and sent before a request's final response, when it
finishes, and at least every FLUSH_EVERY_S while requests run: a round at K=8 sent about 20
updates (counters per drafted and per accepted position among them), now its 4 histogram
observations. The server's estimates (gauges) go at most every FLUSH_EVERY_S. The orchestrator
sends them from a thread of its own (`post`: courier.py), in order with its responses.
"""
from __future__ import annotations

import asyncio
import json
import math
import time

from ..records import DRAFTING, IN_TARGET, Failure, Finish, Off, Proposer, Round, Stats
from . import probe

_LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
_RATE_BUCKETS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
COST_PARTS = ("draft_call", "draft_token", "verify_call", "verify_token", "other")
FLUSH_EVERY_S = 1.0


class Metrics:
    def __init__(self, pb, model: str, max_draft_tokens: int, estimates=None,
                 in_target: tuple[Proposer, ...] = IN_TARGET, hosted: bool = False):
        """estimates: () -> planner.Estimates, the live figures the policy decides on;
        in_target: the proposers drafting inside target_model's call (settings.in_target);
        hosted: the target's engine is in this process (hosted.py): its calls are not BLS
        calls."""
        self.target_calls = 0 if hosted else 1
        # post(fn, *args): how an update reaches the server (the orchestrator's courier; here,
        # at once).
        self.post = lambda fn, *args: fn(*args)
        kinds = pb.MetricFamily
        labels = {"model": model}
        # Triton requires each MetricFamily to outlive its metrics: all are kept here.
        self._families = []

        def family(name, description, kind):
            f = pb.MetricFamily(name=name, description=description, kind=kind)
            self._families.append(f)
            return f

        def counter(name, description):
            return family(name, description, kinds.COUNTER).Metric(labels=labels)

        def histogram(name, description, buckets):
            return family(name, description, kinds.HISTOGRAM).Metric(labels=labels, buckets=buckets)

        self.active = family("specdec_active_sequences",
                             "Sequences being generated now (KV slots held in draft and target)",
                             kinds.GAUGE).Metric(labels=labels)
        suffix = family("specdec_suffix_tree",
                        "Suffix decoding's tree of earlier outputs: tokens kept and trie nodes",
                        kinds.GAUGE)
        self.suffix_tokens = suffix.Metric(labels={**labels, "part": "tokens"})
        self.suffix_nodes = suffix.Metric(labels={**labels, "part": "nodes"})
        def by_proposer(name, description):
            f = family(name, description, kinds.COUNTER)
            return {p: f.Metric(labels={**labels, "proposer": p}) for p in DRAFTING}

        self.draft_tokens = by_proposer("specdec_draft_tokens_total",
                                        "Tokens proposed (draft model or prompt lookup)")
        self.accepted_tokens = by_proposer("specdec_accepted_tokens_total",
                                           "Proposed tokens accepted by the target")
        # A drafter in target_model drafts round r + 1 inside round r's verification: what r + 1
        # then did not verify was drafted for nothing (on the H200, a co-located draft that the
        # policy kept off drafted a token every round, 0.64 of target-only served).
        self.discarded_tokens = by_proposer(
            "specdec_discarded_draft_tokens_total",
            "Tokens a drafter in target_model drafted a round ahead that the round did not verify")
        self.rounds = counter("specdec_rounds_total", "Propose/verify rounds (target passes)")
        # Where the target's engine runs, the verifications each engine call carried (batching.py);
        # Triton's statistics count target_model's executions only when the engine is there.
        self.target_batches = counter("specdec_target_batches_total",
                                      "Target engine calls carrying verifications")
        self.target_rows = counter("specdec_target_batch_rows_total",
                                   "Verifications (sequences' rounds) those calls carried")
        # A round is one target call, and one draft_model call before it when the draft model
        # proposes from there; a drafter in target_model (a head, a draft model placed there)
        # drafts inside the target's call. By the round's proposer ("none": the round drafted
        # nothing) and where it drafts (placement: one value per proposer on a server).
        calls = family("specdec_bls_calls_total",
                       "BLS calls to draft_model and target_model, by the round's proposer",
                       kinds.COUNTER)
        per_round = family("specdec_bls_calls_per_round",
                           "BLS calls per round since start, by the round's proposer",
                           kinds.GAUGE)
        self.placement = {p: placement(p, in_target) for p in DRAFTING + ("none",)}
        self.calls = {p: calls.Metric(labels={**labels, "proposer": p, "placement": where})
                      for p, where in self.placement.items()}
        self.calls_per_round = {p: per_round.Metric(labels={**labels, "proposer": p,
                                                            "placement": where})
                                for p, where in self.placement.items()}
        self._calls_seen = {p: [0, 0] for p in DRAFTING + ("none",)}   # calls, rounds
        self.output_tokens = counter("specdec_output_tokens_total", "Tokens returned to clients")
        requests = family("specdec_requests_total", "Finished requests by finish reason",
                          kinds.COUNTER)
        self.requests = {r: requests.Metric(labels={**labels, "finish_reason": r})
                         for r in Finish}
        positions = family("specdec_accepted_at_position_total",
                           "Rounds whose draft token at this position (1..K) was accepted",
                           kinds.COUNTER)
        proposed = family("specdec_drafted_at_position_total",
                          "Rounds that drafted a token at this position (1..K)", kinds.COUNTER)
        self.accepted_at = {p: [positions.Metric(labels={**labels, "proposer": p,
                                                         "position": str(j + 1)})
                                for j in range(max_draft_tokens)] for p in DRAFTING}
        self.drafted_at = {p: [proposed.Metric(labels={**labels, "proposer": p,
                                                       "position": str(j + 1)})
                               for j in range(max_draft_tokens)] for p in DRAFTING}
        self.acceptance_rate = histogram("specdec_request_acceptance_rate",
                                         "Per-request accepted / drafted tokens", _RATE_BUCKETS)
        self.accepted_per_round = histogram(
            "specdec_accepted_tokens_per_round", "Draft tokens accepted in a round",
            [float(j) for j in range(max_draft_tokens + 1)])
        self.ttft = histogram("specdec_time_to_first_token_seconds",
                              "Request arrival to its first output token", _LATENCY_BUCKETS)
        self.itl = histogram("specdec_inter_token_latency_seconds",
                             "Time between streamed chunks divided by their tokens",
                             _LATENCY_BUCKETS)
        self.draft_latency = histogram("specdec_draft_latency_seconds",
                                       "One draft_model call (K tokens)", _LATENCY_BUCKETS)
        self.verify_latency = histogram("specdec_verify_latency_seconds",
                                        "One target_model call (K+1 positions)", _LATENCY_BUCKETS)
        self.round_latency = histogram("specdec_round_latency_seconds",
                                       "Draft + verify of one round", _LATENCY_BUCKETS)
        # Rounds that chose 0 are counted (by reason) in specdec_speculation_off_rounds_total
        # instead: a histogram observation is a message per round, and a round that drafts
        # nothing is where speculation cannot pay for it.
        self.chosen_k = histogram("specdec_chosen_draft_tokens",
                                  "Draft tokens chosen for a round that drafted",
                                  [float(j) for j in range(1, max_draft_tokens + 1)])
        off = family("specdec_speculation_off_rounds_total",
                     "Rounds drafting nothing although the request allowed it, by reason",
                     kinds.COUNTER)
        self.off_rounds = {r: off.Metric(labels={**labels, "reason": r}) for r in Off}
        failures = family("specdec_draft_failures_total",
                          "Draft calls that failed; the round went on target-only", kinds.COUNTER)
        self.draft_failures = {r: failures.Metric(labels={**labels, "reason": r})
                               for r in Failure}
        accept = family("specdec_acceptance_estimate",
                        "Server-wide acceptance at a draft position, given the earlier accepted",
                        kinds.GAUGE)
        self.acceptance_estimate = {p: [accept.Metric(labels={**labels, "proposer": p,
                                                              "position": str(j + 1)})
                                        for j in range(max_draft_tokens)] for p in DRAFTING}
        cost = family("specdec_round_cost_seconds",
                      "Fitted cost of a round's parts at the current load", kinds.GAUGE)
        self.cost_estimate = {p: cost.Metric(labels={**labels, "part": p}) for p in COST_PARTS}
        self.estimates = estimates
        self._pending: dict[object, float] = {}   # counter -> increment not sent yet
        self._flushed_at = time.monotonic()
        self._calls_shown: dict[str, float] = {}   # proposer -> calls a round last sent
        self._estimated_at = -math.inf             # when the estimates were last sent
        # The timer that sends them once due, and its event loop.
        self._estimates_later: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None

    def _count(self, counter, n: float) -> None:
        if n:
            self._pending[counter] = self._pending.get(counter, 0) + n

    def flush(self, estimates: bool = True) -> None:
        """The counters' increments and calls per round (where changed); estimates: the
        server's acceptance and cost estimates too, where due. A request's last response waits
        behind what is flushed before it: its counts, not the estimates (posted before it they
        cost each final response 0.8 ms on the 2-core CPU; docs/benchmarks.md, "A request's
        first token at one stream")."""
        pending, self._pending = self._pending, {}
        post = self.post
        for counter, n in pending.items():
            post(counter.increment, n)
        self._flushed_at = time.monotonic()
        for p, (n_calls, n_rounds) in self._calls_seen.items():
            if n_rounds and self._calls_shown.get(p) != n_calls / n_rounds:
                self._calls_shown[p] = n_calls / n_rounds
                post(self.calls_per_round[p].set, n_calls / n_rounds)
        if estimates:
            self._estimates_due()

    def _send_estimates(self) -> None:
        """A gauge a proposer's position and a cost part: 45 updates at max_draft_tokens 8,
        each a message to the server process on the courier, ahead of later responses."""
        if self._estimates_later is not None:
            self._estimates_later[1].cancel()
            self._estimates_later = None
        self._estimated_at = time.monotonic()
        if self.estimates is None:
            return
        e, post = self.estimates(), self.post
        for p, rates in e.acceptance.items():
            for gauge, a in zip(self.acceptance_estimate[p], rates):
                post(gauge.set, a)
        for part, seconds in e.costs.items():
            post(self.cost_estimate[part].set, seconds)

    def _estimates_due(self) -> None:
        """The estimates if FLUSH_EVERY_S has passed since they were last sent, else once it
        has (a timer on the event loop), so that they end exact without every request's end
        sending them (at 16 streams of short requests, a few hundred gauge updates a second
        through the courier that every stream's responses share)."""
        wait = self._estimated_at + FLUSH_EVERY_S - time.monotonic()
        if wait <= 0:
            self._send_estimates()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:   # no event loop (a test's direct call): now
            self._send_estimates()
            return
        if self._estimates_later is not None and self._estimates_later[0] is not loop:
            self._estimates_later[1].cancel()   # on a loop that has closed (a test's earlier one)
            self._estimates_later = None
        if self._estimates_later is None:
            self._estimates_later = (loop, loop.call_later(wait, self._send_estimates))

    def target_batch(self, rows: int) -> None:
        """One target engine call carrying `rows` verifications (the event loop's thread)."""
        self._count(self.target_batches, 1)
        self._count(self.target_rows, rows)

    def set_active(self, n: int) -> None:
        self.post(self.active.set, n)

    def suffix_tree(self, tokens: int, nodes: int) -> None:
        self.post(self.suffix_tokens.set, tokens)
        self.post(self.suffix_nodes.set, nodes)

    def round(self, r: Round) -> None:
        self._count(self.rounds, 1)
        drafted = r.k > 0 or r.failure is not None
        label = r.proposer if drafted else "none"
        calls = self.target_calls + (drafted and self.placement[label] == DRAFT_MODEL)
        self._count(self.calls[label], calls)
        seen = self._calls_seen[label]
        seen[0], seen[1] = seen[0] + calls, seen[1] + 1
        if r.failure:
            self._count(self.draft_failures[r.failure], 1)
        if r.in_target_failure:
            self._count(self.draft_failures[r.in_target_failure], 1)
        if r.discarded:
            self._count(self.discarded_tokens[r.ahead], r.discarded)
        post = self.post
        if r.limit and r.k:
            post(self.chosen_k.observe, r.k)
        elif r.limit and r.reason:
            self._count(self.off_rounds[r.reason], 1)
        if r.k:
            p = r.proposer
            self._count(self.draft_tokens[p], r.k)
            self._count(self.accepted_tokens[p], r.accepted)
            for j in range(r.k):
                self._count(self.drafted_at[p][j], 1)
            for j in range(r.accepted):
                self._count(self.accepted_at[p][j], 1)
            post(self.accepted_per_round.observe, r.accepted)
            if p == Proposer.DRAFT:
                post(self.draft_latency.observe, r.draft_s)
        post(self.verify_latency.observe, r.verify_s)
        post(self.round_latency.observe, r.draft_s + r.verify_s)
        if time.monotonic() - self._flushed_at >= FLUSH_EVERY_S:
            self.flush()

    def tokens(self, n: int, since_last_s: float, first: bool) -> None:
        self._count(self.output_tokens, n)
        if first:
            self.post(self.ttft.observe, since_last_s)
        elif n:
            self.post(self.itl.observe, since_last_s / n)

    def finished(self, reason: Finish, stats: Stats | None, is_probe: bool = False) -> None:
        """A request's end. A health probe's (`is_probe(request)`) is no user's request: it is
        left out of specdec_requests_total, where it once made every probe an "invalid"."""
        if not is_probe:
            self._count(self.requests[reason if reason in self.requests else Finish.ERROR], 1)
        if stats is not None and stats.total_draft_tokens:
            self.post(self.acceptance_rate.observe, stats.acceptance_rate)
        self.flush()


DRAFT_MODEL = "draft_model"


def placement(proposer: str, in_target: tuple[Proposer, ...]) -> str:
    """Where a proposer drafts: "target" (inside target_model's verification), "draft_model"
    (a call of its own), "orchestrator" (prompt lookup); "none" for rounds that drafted none."""
    if proposer in in_target:
        return "target"
    return {Proposer.DRAFT: DRAFT_MODEL, Proposer.NGRAM: "orchestrator"}.get(proposer, "none")


def is_probe(request) -> bool:
    """Whether a pb_utils.InferenceRequest is `specdec probe`'s (its request parameter)."""
    try:
        return json.loads(request.parameters() or "{}").get(probe.PARAMETER) is True
    except (AttributeError, ValueError):
        return False
