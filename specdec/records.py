"""The plain records the loop, its models and its servers pass around, and the names they carry.

Calls and their results (a proposal, a verdict), a request, its rounds, chunks and statistics;
the proposers, finish reasons, off reasons and failure reasons as enums. No torch: prompt lookup,
the orchestrator, the serving adapters and the OpenAI gateway import these without loading it.
A proposal's and a verification call's probabilities are torch tensors at run time, named here
as annotations only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import torch

AUTO = -1   # num_draft_tokens: k chosen per round by the policy, up to max_draft_tokens


class Name(str, Enum):
    """A name that is its string: equal to it, hashed like it, printed, sent and labelled as it."""

    def __str__(self) -> str:
        return self.value


class Proposer(Name):
    """What drafts a round's tokens; a request may also ask for HYBRID, any of the others chosen
    per round (loop.PROPOSER_SETS)."""
    DRAFT = "draft"     # the draft model
    NGRAM = "ngram"     # prompt lookup (ngram.py)
    SUFFIX = "suffix"   # suffix decoding: this request's text and earlier outputs (suffix.py)
    EAGLE = "eagle"     # an EAGLE-3 head in the target (eagle/)
    SELF = "self"       # the target with layers skipped (swift.py)
    MEDUSA = "medusa"   # Medusa heads on the target's last hidden state (medusa/)
    HYBRID = "hybrid"


# The proposers that draft, and those that always draft inside the target's verification (a
# draft model may too, placed in the target's process: settings decide).
DRAFTING = (Proposer.DRAFT, Proposer.NGRAM, Proposer.EAGLE, Proposer.SELF, Proposer.MEDUSA,
            Proposer.SUFFIX)
IN_TARGET = (Proposer.EAGLE, Proposer.SELF, Proposer.MEDUSA)


class Finish(Name):
    """Why a request ended. The loop ends it with the first four; the server with the rest."""
    LENGTH = "length"             # max_tokens, or the context window full
    EOS = "eos"
    STOP = "stop"                 # a stop sequence
    CANCELLED = "cancelled"
    INVALID = "invalid"           # refused bad input
    UNAVAILABLE = "unavailable"   # no slot within queue_timeout_s, or a model restarting
    ERROR = "error"


class Off(Name):
    """Why a round drafts nothing though the request allowed drafts (policy.Choice.reason)."""
    ACCEPTANCE = "acceptance"     # the estimates say drafting does not pay
    DRAFT_DOWN = "draft_down"     # the draft model failed and is backing off
    LOAD_CAP = "load_cap"         # the operator's load cap
    NO_MATCH = "no_match"         # no n-gram to propose from


class Failure(Name):
    """Why a proposer's call failed; the round goes on target-only."""
    ERROR = "error"
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"


class SlotError(RuntimeError):
    """A per-sequence failure: the caller reports it for that request only."""

    def __init__(self, message: str, unavailable: bool = False):
        super().__init__(message)
        self.unavailable = unavailable  # pool full: retry later, the request itself was fine


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0       # 0: off
    top_p: float = 1.0   # 1: off
    seed: int = 0        # uint64

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# Logprobs: at most this many alternatives a position (OpenAI's top_logprobs limit).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    """A scored token: its log-probability under the target's distribution at its position
    (the one the request samples from: the temperature, top-k and top-p applied; at temperature 0
    the model's own softmax), and the most likely ids there with theirs, likeliest first."""
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class ProposeCall:
    seq_id: int
    start: int
    tokens: list[int]          # committed tokens from `start` on, not cached yet (>= 1)
    k: int                     # tokens to draft (>= 1)
    sampling: SamplingParams


@dataclass
class Proposal:
    tokens: list[int]               # [<= k]; fewer (even none) from a proposer without a guess
    probs: torch.Tensor | None      # [len(tokens), V] on the engine's device; None: one-hot
                                    # (a greedy draft, or a deterministic proposer)


@dataclass
class VerifyCall:
    seq_id: int
    start: int
    tokens: list[int]               # committed tokens from `start` on, not cached yet (>= 1)
    drafts: list[int]               # [k], k >= 0
    draft_probs: torch.Tensor | None  # [k, V'] or None: one-hot of drafts, exact for any
                                      # target sampling (verify.py)
    sampling: SamplingParams
    # A drafter in the target's process (in_target.py) drafts the next round inside this
    # verification: None, none does for this sequence; else next_by drafts next_k (>= 0) tokens
    # (an EAGLE-3 head also catches up on the committed positions with 0).
    next_k: int | None = None
    drafts_in_target: bool = False   # drafts are the in-target drafter's last proposal: verify
                                     # with the q it kept
    next_by: Proposer | None = None
    # The committed tokens' logprobs with this many alternatives each (None: not asked), and
    # the prompt's (a sequence's first verification: its tokens after the first).
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # A grammar's token masks (numpy int32 [k + 1, ceil(V / 32)], grammar.py) for the
    # positions this call scores: the target chooses among the allowed tokens only.
    masks: "np.ndarray | None" = None

    @property
    def prefill(self) -> int:
        """The prompt tokens this call prefills: all of its committed tokens in a sequence's
        first verification, none after."""
        return len(self.tokens) if self.start == 0 else 0


@dataclass
class Verdict:
    tokens: list[int]          # accepted drafts + the target's correction or bonus token
    num_accepted: int
    proposal: list[int] | None = None  # with next_k: next_by's drafts for the next round
    draft_s: float = 0.0       # seconds the in-target drafter took over them (the batch's)
    failure: Failure | None = None  # that drafter failed: the verdict stands, no proposal
    # What the batch's cost grew with (a row's own k does not move it when other rows draft
    # more): the most drafts a row of this verification carried, and the drafter's steps.
    batch_k: int = 0
    steps: int = 0
    # Committed tokens the drafter read before drafting (the batch's most): a draft model that
    # sat out rounds catches up on them, and that proposal then cost a prefill, not a step.
    fed: int = 0
    logprobs: list[TokenLogprob] | None = None         # one per token, when the call asked
    prompt_logprobs: list[TokenLogprob] | None = None  # the call's tokens after the first


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    max_tokens: int
    num_draft_tokens: int                    # exactly this k per round; with auto, the cap
    sampling: SamplingParams = SamplingParams()
    stop: tuple[tuple[int, ...], ...] = ()   # token sequences that end generation (not shown)
    eos: tuple[int, ...] = ()                # ids that end generation (not shown)
    auto: bool = False                       # k chosen per round by the policy (policy.py)
    # Sampled tokens depend on the round structure, so a seeded sampling request's k may depend
    # only on its own history: its output is then a function of its inputs and seed alone.
    reproducible: bool = False
    # The first round is the target's prefill alone, so the first token comes as soon as
    # without speculation; the draft prefills on its first proposal instead.
    prefill_alone: bool = True
    proposer: Proposer = Proposer.DRAFT
    # Return each output token's logprob with this many alternatives (None: none), and the
    # prompt's (its first token has none). max_tokens 0 then scores the prompt alone.
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    json_schema: str | None = None   # the output follows this JSON schema (grammar.py)
    tenant: str = ""                 # whose earlier outputs suffix decoding may propose from


@dataclass(frozen=True)
class Round:
    k: int                    # tokens drafted (0 when the draft failed)
    accepted: int             # of those, accepted
    draft_s: float            # the draft call, as the loop waited for it
    verify_s: float           # the target call
    other_s: float | None = None  # the loop's own time since the previous round's verification
    prefill: bool = False     # the target saw the prompt (or a long catch-up) this round
    draft_fed: int = 0        # committed tokens the draft had to catch up on (0: no draft call)
    failure: Failure | None = None  # the draft call failed
    limit: int = 0            # the most the request allowed this round
    reason: Off | None = None   # why k is 0 though limit is not (policy.Choice.reason)
    proposer: Proposer = Proposer.DRAFT   # who proposed (or was asked to)
    # An in-target drafter drafts a round ahead, before k is chosen: the steps it ran over the
    # batch that drafted this proposal (at least the tokens it drafted for this row); draft_s is
    # theirs.
    drafted: int = 0
    # The in-target drafter failed in this verification: no proposal next.
    in_target_failure: Failure | None = None
    # The verification cost's x (policy.py): a batched call costs what its widest row asks, so
    # the most drafts any row of its batch carried; None: the row's own k.
    batch_k: int | None = None
    # Tokens the in-target drafter (`ahead`) drafted for this round, a round ahead, that this
    # round did not verify: its steps spent for nothing (another proposer won, or k was less).
    discarded: int = 0
    ahead: Proposer | None = None
    # What `ahead` took to draft them, where this round chose another proposer or none (its
    # cost is learned from these too: one that is never chosen still drafts, ready to probe).
    ahead_s: float | None = None


@dataclass
class Stats:
    num_output_tokens: int = 0
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    ngram_draft_tokens: int = 0              # of the totals, what prompt lookup proposed
    ngram_accepted_tokens: int = 0
    rounds: int = 0
    accepted_per_round: list[int] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.total_accepted_draft_tokens / max(self.total_draft_tokens, 1)


@dataclass
class Chunk:
    tokens: list[int]              # output tokens now safe to show
    finish_reason: Finish | None   # None until the last chunk: LENGTH, EOS, STOP or CANCELLED
    stats: Stats
    logprobs: list[TokenLogprob] | None = None         # one per token, when the request asked
    prompt_logprobs: list[TokenLogprob] | None = None  # in the first chunk, when asked
