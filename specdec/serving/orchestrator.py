"""The speculative_decoding model's request handling: admit, run the loop, stream, release.

Decoupled: each request gets its responses through its own sender and always ends with the
FINAL flag, after success, an error or a cancellation.

Cancellation: a request cancelled by its client ends within CANCEL_CHECK_S and two rounds.
Inside the ensemble this model's request is never the cancelled one (Triton checks an
ensemble's cancellation between its steps, and this step runs from the first token to the
last): there postprocessing sees the cancellation on a later response's step (it asks a
generation at most every 0.1 s, bls.CancelForwarder) and sends a control request,
`cancel_generation` with the generation id every response carries, which ends the generation
at its next round.
"""
from __future__ import annotations

import asyncio
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from .. import names
from .grammar import Constraint, GrammarError, Grammars
from ..decoding.loop import open_policy, speculate
from ..proposers.ngram import NgramProposer
from ..proposers.suffix import SuffixProposer
from ..planning.planner import Planner
from ..records import Chunk, Finish, Request, Stats, TokenLogprob
from . import detokenize
from .adapter import read_inputs, triton_error
from .courier import Courier
from .metrics import Metrics, is_probe
from .requests import InvalidInput, parse_request
from .settings import OrchestratorSettings

INPUTS = (names.INPUT_IDS, names.STOP_IDS, names.STOP_LENGTHS, names.MAX_TOKENS, names.STREAM,
          names.TEMPERATURE, names.TOP_P, names.TOP_K, names.SEED, names.NUM_DRAFT_TOKENS,
          names.PROPOSER, names.RANDOM_SEED, names.EXCLUDE_INPUT_IN_OUTPUT,
          names.FREQUENCY_PENALTY, names.PRESENCE_PENALTY, names.BAD_WORDS,
          names.RETURN_LOG_PROBS, names.TOP_LOGPROBS, names.PROMPT_LOGPROBS, names.JSON_SCHEMA,
          names.TENANT)


# request.is_cancelled() is a round trip to the server process: at 16 streams, asked every
# round, it was 8 % of the orchestrator's time (py-spy); asked at most this often on the event
# loop, still nearly half of the loop's own work (py-spy, 2026-11-26), so the courier's thread
# asks it and the loop reads the answer. A cancelled request ends within this and two rounds;
# one cancelled through the ensemble (cancel_generation) at its next round.
CANCEL_CHECK_S = 0.1


class Unavailable(RuntimeError):
    unavailable = True


class Orchestrator:
    def __init__(self, pb, settings: OrchestratorSettings, eos: tuple[int, ...], vocab_size: int,
                 drafter, verifier, metrics: Metrics, special: frozenset[int] = frozenset(),
                 grammars: Callable[[], Grammars] | None = None):
        """special: the ids postprocessing's decode leaves out (tokenizer.special_ids), which
        the streamed responses' windows reach past (detokenize.window). grammars: makes the
        grammar engine on a first structured request (None: the target's engine is in another
        process, where the masks do not travel)."""
        self.pb, self.settings, self.eos, self.vocab_size = pb, settings, eos, vocab_size
        self.special = special
        # A draft model in target_model's process drafts there (in_target.py): no call here.
        self.drafter = drafter if settings.has_draft and not settings.draft_in_target else None
        self.verifier = verifier
        # Prompt lookup runs here, where the committed tokens are: a lookup costs microseconds,
        # a BLS call milliseconds (docs/benchmarks.md).
        self.ngram = NgramProposer(settings.ngram_max_n, settings.ngram_min_n)
        self.suffix = SuffixProposer(settings.suffix_max_tokens,
                                     settings.suffix_tenants == "separate")
        self.metrics = metrics
        self.planner = Planner(settings.max_draft_tokens, settings.load_cap,
                               proposers=settings.proposers, in_target=settings.in_target)
        metrics.estimates = self.planner.estimates
        # Responses and metric updates leave from a thread of their own (courier.py).
        self.courier = Courier()
        metrics.post = self.courier.post
        self.slots = asyncio.Semaphore(settings.max_sequences)
        # async_exec runs each BLS call as a blocking exec on the event loop's default executor,
        # whose default is min(32, CPUs + 4) threads: 6 on a 2-core host, which capped the calls
        # in flight, and so target_model's batch, at 16 streams (docs/benchmarks.md). Room for
        # every generation's call and its releases.
        self.bls_threads = ThreadPoolExecutor(2 * settings.max_sequences + 4,
                                              thread_name_prefix="bls")
        self._loop: asyncio.AbstractEventLoop | None = None
        # Schemas compile on a thread of their own, one at a time (the engine is made by the
        # first), never on the event loop.
        self.make_grammars, self._grammars = grammars, None
        self.compiler = ThreadPoolExecutor(1, thread_name_prefix="grammar")
        self.running: set[int] = set()     # generations under way
        self.cancelled: set[int] = set()   # of those, cancelled through the ensemble

    async def handle(self, request) -> None:
        pb = self.pb
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            loop.set_default_executor(self.bls_threads)
            self._loop = loop
        sender = request.get_response_sender()
        probe = is_probe(request)   # `specdec probe`'s: not counted as a user's request
        cancel = pb.get_input_tensor_by_name(request, names.CANCEL_GENERATION)
        if cancel is not None:
            self._cancel(int(cancel.as_numpy().reshape(-1)[0]))
            self.courier.post(sender.send, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            await self.courier.settle()
            return
        g = _Generation(self, request, sender)
        try:
            g.req, g.stream = parse_request(read_inputs(pb, request, INPUTS), self.settings,
                                            self.eos, self.vocab_size)
            constraint = await self._constraint(g.req.json_schema) if g.req.json_schema else None
            try:
                await asyncio.wait_for(self.slots.acquire(), self.settings.queue_timeout_s)
            except asyncio.TimeoutError:
                raise Unavailable(f"all {self.settings.max_sequences} sequence slots stayed busy "
                                  f"for {self.settings.queue_timeout_s}s; retry later") from None
            policy = open_policy(self.planner, g.req)
            self.metrics.set_active(self.planner.active)
            g.gid = self._new_id()
            self.running.add(g.gid)
            try:
                await speculate(g.gid, g.req, self.drafter, self.verifier,
                                self.settings.max_seq_len, g.emit, g.cancelled,
                                self.metrics.round, policy, self.settings.draft_timeout_s,
                                self.ngram, self.settings.in_target, constraint, self.suffix)
            finally:
                self.running.discard(g.gid)
                self.cancelled.discard(g.gid)
                self.planner.close(policy)
                self.metrics.set_active(self.planner.active)
                self.metrics.suffix_tree(self.suffix.held, self.suffix.nodes)
                self.slots.release()
        except Exception as exc:  # every failure becomes this request's error, never the model's
            g.fail(exc)
        finally:
            g.end()
            self.metrics.finished(g.finish, g.stats, probe)
            await self.courier.settle()   # when handle returns, its responses have left

    async def _constraint(self, schema: str) -> Constraint:
        """The request's grammar, compiled off the event loop (a new schema's compilation, and
        the first one's engine, take milliseconds to seconds)."""
        if self.make_grammars is None:
            raise InvalidInput(f"{names.JSON_SCHEMA}: structured outputs need the target's engine "
                               f"in this process (SPECDEC_TARGET_PLACEMENT auto or "
                               f"orchestrator, one device)")
        try:
            return await asyncio.get_running_loop().run_in_executor(self.compiler, self._compile,
                                                                    schema)
        except GrammarError as e:
            raise InvalidInput(f"{names.JSON_SCHEMA}: {e}") from None

    def _compile(self, schema: str) -> Constraint:
        if self._grammars is None:
            self._grammars = self.make_grammars()
        return self._grammars.constraint(schema)

    def _new_id(self) -> int:
        """A generation's id, also its sequence id in the models: random, not counted, since a
        control request ends the generation it names and one client must not guess another's."""
        while True:
            gid = secrets.randbits(63)
            if gid and gid not in self.running:
                return gid

    def _ask(self, request, gid: int) -> None:
        """On the courier's thread: whether the client of a generation under way has gone."""
        if gid in self.running and gid not in self.cancelled and request.is_cancelled():
            self.cancelled.add(gid)

    def _cancel(self, gid: int) -> None:
        """A client of the ensemble cancelled: its generation ends at its next round, as when
        this model's own request is cancelled. An id that has finished (or never ran) is
        ignored."""
        if gid in self.running:
            self.cancelled.add(gid)

    def _send(self, sender, ids: list[int], prefix: int, last: bool, counts: tuple,
              finish_reason: str, gid: int, scored: dict | None = None) -> None:
        """On the courier's thread: one streamed (or the final) response. counts: the prompt's
        tokens, then the generation's counters, in names.STATS_OUTPUTS' order less the finish
        reason.

        Every response carries num_output_tokens (so far: clients time token arrivals by it),
        the last alone the other statistics. Triton's OpenAI frontend adds up
        num_output_tokens over a stream's responses that carry both token counts (vLLM's and
        TensorRT-LLM's convention: each response counts its own tokens): with both on every
        response it summed running totals. And five tensors cost the courier about half the
        CPU of twelve (measured here: 140-200 against 310-350 us a response at 16 streams,
        where a GPU serves ~450 responses a second). scored: the logprob tensors, where the
        request asked (_scored)."""
        pb = self.pb
        prompt_tokens, out, drafted, accepted, rate, ngram_drafted, ngram_accepted = counts
        tensors = {
            names.OUTPUT_IDS: np.array(ids, np.int32),
            names.PREFIX_LENGTH: np.array([prefix], np.int32),
            names.IS_FINAL: np.array([last], bool),
            names.GENERATION_ID: np.array([gid], np.uint64),
            names.NUM_OUTPUT_TOKENS: np.array([out], np.int32),
        }
        if last:
            tensors.update({
                names.NUM_INPUT_TOKENS: np.array([prompt_tokens], np.int32),
                names.TOTAL_DRAFT_TOKENS: np.array([drafted], np.int32),
                names.TOTAL_ACCEPTED_DRAFT_TOKENS: np.array([accepted], np.int32),
                names.ACCEPTANCE_RATE: np.array([rate], np.float32),
                names.FINISH_REASON: np.array([finish_reason.encode()], object),
                names.NGRAM_DRAFT_TOKENS: np.array([ngram_drafted], np.int32),
                names.NGRAM_ACCEPTED_TOKENS: np.array([ngram_accepted], np.int32)})
        if scored:
            tensors.update(scored)
        sender.send(pb.InferenceResponse(output_tensors=[pb.Tensor(n, v)
                                                         for n, v in tensors.items()]),
                    flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)


def _scored_tensors(scored: list[TokenLogprob], top: int, values: str, top_ids: str,
                    top_values: str) -> dict[str, np.ndarray]:
    """Logprobs [n], and with alternatives their ids and logprobs [n, top]."""
    out = {values: np.array([lp.logprob for lp in scored], np.float32)}
    if top:
        width = len(scored[0].top) if scored else top   # fewer where the vocabulary is
        out[top_ids] = np.array([[i for i, _ in lp.top] for lp in scored], np.int32
                                ).reshape(len(scored), width)
        out[top_values] = np.array([[v for _, v in lp.top] for lp in scored], np.float32
                                   ).reshape(len(scored), width)
    return out


class _Generation:
    """One request's side of the conversation with its client while the loop drives it: the
    tokens shown and held back, whether the final response has left, how it finished, when
    the client's cancellation was last asked. emit and cancelled are the loop's callbacks."""

    def __init__(self, orchestrator: "Orchestrator", request, sender):
        self.o, self.request, self.sender = orchestrator, request, sender
        self.req: Request | None = None   # parsed, once it is
        self.stream = False
        self.gid = 0                      # the generation's id, once admitted
        self.shown: list[int] = []        # tokens sent
        self.pending: list[int] = []      # emitted, not sent yet (a non-streamed request's all)
        self.pending_logprobs: list[TokenLogprob] = []   # theirs, where the request asked
        self.prompt_logprobs: list[TokenLogprob] | None = None   # until the first response
        self.final_sent = False
        self.finish = Finish.ERROR
        self.stats: Stats | None = None
        self.last_time, self.first = time.perf_counter(), True
        self.asked = 0.0                  # when request.is_cancelled() was last asked

    def emit(self, chunk: Chunk) -> None:
        o = self.o
        now = time.perf_counter()
        if chunk.tokens:
            o.metrics.tokens(len(chunk.tokens), now - self.last_time, self.first)
            self.last_time, self.first = now, False
        self.finish, self.stats = chunk.finish_reason or self.finish, chunk.stats
        self.pending.extend(chunk.tokens)
        self.pending_logprobs.extend(chunk.logprobs or ())
        if chunk.prompt_logprobs is not None:
            self.prompt_logprobs = chunk.prompt_logprobs
        if not (self.stream or chunk.finish_reason):
            return
        last = chunk.finish_reason is not None
        if last:  # a client reading the metrics after its answer sees its counts
            o.metrics.flush(estimates=False)   # finished() sends the rest
        # The response is built on the courier's thread too (its tensors were half of what a
        # streamed token cost the loop): from values taken now, as the loop goes on changing
        # shown and stats.
        ids, prefix = detokenize.window(self.shown, self.pending, o.special)
        st = chunk.stats
        counts = (len(self.req.prompt), st.num_output_tokens, st.total_draft_tokens,
                  st.total_accepted_draft_tokens, st.acceptance_rate,
                  st.ngram_draft_tokens, st.ngram_accepted_tokens)
        o.courier.post(o._send, self.sender, ids, prefix, last, counts,
                       chunk.finish_reason or "", self.gid, self._scored())
        self.final_sent = last
        self.shown.extend(self.pending)
        self.pending.clear()

    def _scored(self) -> dict | None:
        """The logprob tensors of the tokens about to be sent, and the prompt's in the first
        response; None where the request asked for none."""
        out = {}
        if self.req.logprobs is not None:
            out.update(_scored_tensors(self.pending_logprobs, self.req.logprobs,
                                       names.OUTPUT_LOG_PROBS, names.TOP_LOGPROB_IDS,
                                       names.TOP_LOGPROB_VALUES))
            self.pending_logprobs = []
        if self.prompt_logprobs is not None:
            out.update(_scored_tensors(self.prompt_logprobs, self.req.prompt_logprobs,
                                       names.PROMPT_LOG_PROBS, names.PROMPT_TOP_LOGPROB_IDS,
                                       names.PROMPT_TOP_LOGPROB_VALUES))
            self.prompt_logprobs = None
        return out or None

    def cancelled(self) -> bool:
        o = self.o
        if self.gid in o.cancelled:
            return True
        now = time.monotonic()
        if now - self.asked >= CANCEL_CHECK_S:
            self.asked = now
            o.courier.post(o._ask, self.request, self.gid)
        return self.gid in o.cancelled   # at once where the courier is not threaded

    def fail(self, exc: Exception) -> None:
        """Bad input and a full or restarting server are the client's to fix or retry."""
        pb = self.o.pb
        self.finish = (Finish.INVALID if isinstance(exc, InvalidInput) else
                       Finish.UNAVAILABLE if getattr(exc, "unavailable", False) else
                       Finish.ERROR)
        if not self.final_sent:
            self.o.courier.post(self.sender.send, pb.InferenceResponse(
                output_tensors=[], error=triton_error(pb, exc)),
                flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            self.final_sent = True

    def end(self) -> None:
        """Every request's responses end with the FINAL flag."""
        if not self.final_sent:
            self.o.courier.post(self.sender.send,
                                flags=self.o.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
