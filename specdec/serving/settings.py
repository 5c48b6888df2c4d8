"""Model settings, parsed once in `initialize` from config.pbtxt parameters and the environment.

Environment variables win over config.pbtxt, so one deployment setting (a Helm value, a
`docker run -e`) reaches all models at once; a bad value fails the load with its name.
Checkpoint paths are set in the environment only (no config.pbtxt carries them), and every
model reads them through `model_paths`. docs/configuration.md lists every setting.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..records import IN_TARGET, Proposer

if TYPE_CHECKING:
    import torch

ENV_PREFIX = "SPECDEC_"
REPO_ROOT = Path(__file__).resolve().parents[2]
# The embedded default pair in a source checkout; an installed package (the image) names its
# copy with $SPECDEC_DEFAULT_MODELS (default_pair()).
DEFAULT_TARGET = REPO_ROOT / "models" / "default" / "target"
DEFAULT_DRAFT = REPO_ROOT / "models" / "default" / "draft"

# torch is imported where a model is loaded, never here: preprocessing, postprocessing, the
# launcher and the OpenAI gateway read settings and load no model.
_DTYPES = ("float32", "float16", "bfloat16", "float64")


NO_DRAFT = "none"   # $SPECDEC_DRAFT_MODEL=none: no draft model, prompt lookup only


class SettingsError(ValueError):
    pass


def _lookup(params: dict, name: str, env_name: str | None):
    """The environment, then config.pbtxt `parameters` as Triton hands them to the backend."""
    env = os.environ.get(env_name) if env_name else None
    if env not in (None, ""):
        return env, f"${env_name}"
    raw = params.get(name)
    if isinstance(raw, dict):
        raw = raw.get("string_value")
    return (raw if raw not in (None, "") else None), f"config.pbtxt parameter {name!r}"


def _parse(cls, params: dict, env_names: dict[str, str] | None = None, skip=()):
    values = {}
    for f in fields(cls):
        if f.name in skip:
            continue
        env_name = (env_names or {}).get(f.name, ENV_PREFIX + f.name.upper())
        raw, where = _lookup(params, f.name, env_name)
        if raw is None:
            continue
        kind = type(f.default)
        try:
            values[f.name] = _bool(raw) if kind is bool else kind(raw)
        except ValueError:
            raise SettingsError(f"{where}: {raw!r} is not a valid {kind.__name__}") from None
    return cls(**values)


def _bool(raw: str) -> bool:
    word = raw.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def default_pair() -> Path:
    """The embedded default pair's directory (target/, draft/): $SPECDEC_DEFAULT_MODELS where the
    package is installed apart from it (the image), else the source checkout's models/default."""
    raw = os.environ.get(ENV_PREFIX + "DEFAULT_MODELS")
    return Path(raw) if raw else REPO_ROOT / "models" / "default"


@dataclass(frozen=True)
class ModelPaths:
    """The checkpoints a deployment serves; every model reads them through model_paths()."""
    target: str
    draft: str            # NO_DRAFT: no draft model
    head: str             # "": no EAGLE-3 head
    tokenizer: str        # what pre/postprocessing load; the draft's is checked against it
    draft_reason: str     # why this draft, for the line logged at start


# field: (the params key, the environment variable). Tests hand paths in `params`; no
# config.pbtxt carries them, so the environment is the one place a deployment sets them.
_PATHS = {"target": ("target_model_path", "TARGET_MODEL"),
          "draft": ("draft_model_path", "DRAFT_MODEL"),
          "head": ("eagle_head_path", "EAGLE_HEAD"),
          "tokenizer": ("tokenizer_path", "TOKENIZER")}


def model_paths(params: dict) -> ModelPaths:
    """Target, draft, head and tokenizer paths. A target named by $SPECDEC_TARGET_MODEL other than
    the default pair's gets no draft unless $SPECDEC_DRAFT_MODEL names one: the embedded toy
    draft only ever proposes for the embedded target."""
    got = {k: _lookup(params, key, ENV_PREFIX + env) for k, (key, env) in _PATHS.items()}
    pair = default_pair()
    default_target = str(pair / "target")
    target = got["target"][0] or default_target
    draft, where = got["draft"]
    user_target = os.environ.get(ENV_PREFIX + "TARGET_MODEL") and not _same_dir(target,
                                                                                 default_target)
    if draft:
        reason = f"draft model from {where}" if draft != NO_DRAFT else f"{where} is {NO_DRAFT!r}"
    elif user_target:
        draft = NO_DRAFT
        reason = (f"$SPECDEC_TARGET_MODEL is {target}, not the default pair's target, and "
                  f"$SPECDEC_DRAFT_MODEL is unset: the default toy draft serves only the default "
                  f"target")
    else:
        draft, reason = str(pair / "draft"), "the default pair's draft model"
    head = got["head"][0] or ""
    return ModelPaths(target, draft, "" if head == NO_DRAFT else head,
                      got["tokenizer"][0] or target, reason)


PLACEMENTS = ("auto", "target", "separate")
TARGET_PLACEMENTS = ("auto", "separate", "orchestrator")


@dataclass(frozen=True)
class InTargetSettings:
    """What drafts inside target_model's process (specdec/runtime/in_target.py); target_model,
    draft_model and the orchestrator read it alike, so they agree on where the draft runs.

    draft_placement: target: the draft model's weights in target_model's process, drafting
    inside each verification (one call a round); separate: in draft_model (two calls a round),
    the placement for a draft on a device of its own or the CPU beside a GPU target; auto:
    separate where $SPECDEC_DRAFT_DEVICE names a device of its own or the target is sharded
    ($SPECDEC_TENSOR_PARALLEL > 1), else target.

    target_placement: separate: the target's engine in target_model, a BLS call a round;
    orchestrator: in speculative_decoding's process, beside the loop (serving/hosted.py): no
    call, no stub boundary, no queue a round, and target_model loads nothing. "target_model's
    process" above then means that one. auto: orchestrator, or separate where the target is
    sharded (its ranks are started from target_model)."""
    draft_placement: str = "auto"
    self_skip: str = ""           # target layers SWIFT skips (swift.py), e.g. "3,5,7-9"; "": off
    medusa_heads_path: str = ""   # Medusa-1 heads (medusa/); "": none
    target_placement: str = "auto"

    @classmethod
    def parse(cls, params: dict) -> "InTargetSettings":
        s = _parse(cls, params, {"medusa_heads_path": ENV_PREFIX + "MEDUSA_HEADS"})
        if s.draft_placement not in PLACEMENTS:
            raise SettingsError(f"draft_placement {s.draft_placement!r}: expected "
                                f"{', '.join(PLACEMENTS)}")
        if s.target_placement not in TARGET_PLACEMENTS:
            raise SettingsError(f"target_placement {s.target_placement!r}: expected "
                                f"{', '.join(TARGET_PLACEMENTS)}")
        degree, _ = _lookup(params, "tensor_parallel", ENV_PREFIX + "TENSOR_PARALLEL")
        devices, _ = _lookup(params, "target_devices", ENV_PREFIX + "TARGET_DEVICES")
        sharded = int(degree or 1) > 1 or len((devices or "").split(",")) > 1
        if s.target_placement == "auto":
            s = replace(s, target_placement="separate" if sharded else "orchestrator")
        if s.target_hosted and sharded:   # its rank processes are started and tested from
            raise SettingsError(           # target_model only
                "target_placement 'orchestrator' holds an unsharded target: with "
                f"tensor_parallel {degree or 1} / target_devices {devices!r} use 'separate'")
        if s.draft_placement == "auto":
            own, _ = _lookup(params, "draft_device", ENV_PREFIX + "DRAFT_DEVICE")
            apart = (own or "auto") != "auto" and own != (devices or "").split(",")[0]
            s = replace(s, draft_placement="separate" if sharded or apart else "target")
        return s

    @property
    def draft_in_target(self) -> bool:
        return self.draft_placement == "target"

    @property
    def target_hosted(self) -> bool:
        """The target's engine runs in speculative_decoding's process."""
        return self.target_placement == "orchestrator"


def _same_dir(a: str, b: str) -> bool:
    return Path(a).resolve() == Path(b).resolve()


CPU_PREFILL_TOKENS = 128   # max_prefill_tokens' auto on a CPU


@dataclass(frozen=True)
class OrchestratorSettings:
    """speculative_decoding."""
    target_model_path: str = ""      # read for eos ids only; $SPECDEC_TARGET_MODEL (model_paths)
    max_seq_len: int = 1024          # must equal draft_model's and target_model's
    max_sequences: int = 16          # concurrent requests admitted; the rest wait
    max_tokens_limit: int = 1024     # largest max_tokens a request may ask for
    default_max_tokens: int = 64
    max_draft_tokens: int = 8        # largest num_draft_tokens a request may ask for
    default_num_draft_tokens: int = -1  # when a request sends none; -1: auto (policy.py)
    queue_timeout_s: float = 30.0    # wait for a free sequence slot, then UNAVAILABLE
    draft_timeout_s: float = 2.0     # a slower draft call counts as failed: target-only rounds
    spec_full_below: int = 0         # optional cap on k: full below this many active sequences,
    spec_off_at: int = 0             # none from spec_off_at on (0: no cap; seeded sampling exempt)
    draft_model_path: str = ""       # $SPECDEC_DRAFT_MODEL; "none": prompt lookup only
    eagle_head_path: str = ""        # $SPECDEC_EAGLE_HEAD: target_model drafts with this head
    default_proposer: str = ""       # draft, ngram, eagle or hybrid; "": eagle with a head,
                                     # else hybrid with a draft model, else ngram
    ngram_max_n: int = 4             # prompt lookup matches the last max_n..min_n tokens
    ngram_min_n: int = 2
    # Suffix decoding's tree of earlier outputs (suffix.py): at most this many tokens of them,
    # the oldest forgotten first (0: a request's own text only); "separate": one tree per
    # request's tenant input, never shared across tenants.
    suffix_max_tokens: int = 20000
    suffix_tenants: str = "shared"
    # A verification batch's most prompt tokens (its first prompt goes whole): a burst of new
    # requests is prefilled in pieces, the first of them streaming before the last is read,
    # and running sequences go on in every piece. -1: auto (128 on a CPU, none on a GPU);
    # 0: no limit.
    max_prefill_tokens: int = -1
    draft_reason: str = field(default="", compare=False)   # model_paths': for the start line
    # What target_model drafts with in its own process, and where that process is; the default
    # is auto's placements for an unsharded target without a draft device of its own.
    drafters: InTargetSettings = InTargetSettings("target", target_placement="orchestrator")

    @property
    def has_draft(self) -> bool:
        return self.draft_model_path != NO_DRAFT

    @property
    def has_head(self) -> bool:
        return self.eagle_head_path not in ("", NO_DRAFT)

    @property
    def has_self(self) -> bool:
        return bool(self.drafters.self_skip)

    @property
    def has_medusa(self) -> bool:
        return bool(self.drafters.medusa_heads_path)

    @property
    def draft_in_target(self) -> bool:
        return self.has_draft and self.drafters.draft_in_target

    @property
    def proposers(self) -> tuple[Proposer, ...]:
        """What this server drafts with."""
        has = {Proposer.DRAFT: self.has_draft, Proposer.NGRAM: True, Proposer.SUFFIX: True,
               Proposer.EAGLE: self.has_head, Proposer.SELF: self.has_self,
               Proposer.MEDUSA: self.has_medusa}
        return tuple(p for p, ok in has.items() if ok)

    @property
    def in_target(self) -> tuple[Proposer, ...]:
        """The proposers target_model drafts with in its own process (in_target.py), the draft
        model among them where it is placed there."""
        return tuple(p for p in self.proposers if p in IN_TARGET or
                     (p == Proposer.DRAFT and self.draft_in_target))

    def missing(self, proposer: str) -> str | None:
        """What a request's (or the default) proposer needs that this server lacks, or None."""
        if proposer == Proposer.DRAFT and not self.has_draft:
            return f"a draft model, and $SPECDEC_DRAFT_MODEL is {NO_DRAFT!r}"
        if proposer == Proposer.EAGLE and not self.has_head:
            return "an EAGLE-3 head, and $SPECDEC_EAGLE_HEAD is not set"
        if proposer == Proposer.SELF and not self.has_self:
            return "layers to skip, and $SPECDEC_SELF_SKIP is not set"
        if proposer == Proposer.MEDUSA and not self.has_medusa:
            return "Medusa heads, and $SPECDEC_MEDUSA_HEADS is not set"
        if proposer == Proposer.HYBRID and set(self.proposers) <= {Proposer.NGRAM,
                                                                   Proposer.SUFFIX}:
            return ("a draft model, an EAGLE-3 head, Medusa heads or layers to skip, and this "
                    "server has none")
        return None

    @property
    def proposer(self) -> Proposer:
        """What a request that names none drafts with. With a head, the head alone: it measured
        above hybrid (lookup, head and draft model chosen per round) on held-out, out-of-domain
        and repeating prompts at 1 and 16 streams (docs/benchmarks.md, 2026-11-24). Medusa heads
        or skipped layers, set by an operator, are what the operator asked for; else hybrid."""
        if self.default_proposer:
            return Proposer(self.default_proposer)
        for p in (Proposer.EAGLE, Proposer.MEDUSA, Proposer.SELF):
            if p in self.proposers:
                return p
        return Proposer.HYBRID if self.has_draft else Proposer.NGRAM

    def start_line(self) -> str:
        """One line for the log at start: what this server drafts with, where, and why."""
        where = ("draft_model" if not self.draft_in_target else
                 "speculative_decoding's process" if self.drafters.target_hosted else
                 "target_model's process")
        parts = [f"draft model {self.draft_model_path} in {where} (draft_placement "
                 f"{self.drafters.draft_placement})" if self.has_draft else "no draft model",
                 "prompt lookup"]
        if self.has_head:
            parts.append(f"EAGLE-3 head {self.eagle_head_path}")
        if self.has_medusa:
            parts.append(f"Medusa heads {self.drafters.medusa_heads_path}")
        if self.has_self:
            parts.append(f"the target skipping layers {self.drafters.self_skip}")
        if self.drafters.target_hosted:
            parts.append("the target's engine in speculative_decoding's process "
                         "(target_placement orchestrator)")
        return (f"proposers {', '.join(self.proposers)} ({'; '.join(parts)}; draft: "
                f"{self.draft_reason or 'given'}); requests that name none use "
                f"'{self.proposer}'")

    def prefill_budget(self) -> int | None:
        """max_prefill_tokens resolved: None for no limit. Auto's 128 on a CPU: a 16-request
        burst on smollm2-135m, float32, 2 cores, reached its first tokens in 267-311 ms mean
        against 518 as one batch, in process (docs/benchmarks.md, "Against vLLM on the same
        CPU"); on a GPU a prompt token costs little beside a step, and no limit is unmeasured
        there."""
        if self.max_prefill_tokens == -1:
            import torch
            return None if torch.cuda.is_available() else CPU_PREFILL_TOKENS
        return self.max_prefill_tokens or None

    @property
    def load_cap(self) -> tuple[int, int] | None:
        return (self.spec_full_below, self.spec_off_at) if self.spec_off_at else None

    @classmethod
    def parse(cls, params: dict) -> "OrchestratorSettings":
        paths = model_paths(params)
        s = _parse(cls, params, skip=("target_model_path", "draft_model_path", "eagle_head_path",
                                      "draft_reason", "drafters"))
        s = cls(**{**s.__dict__, "target_model_path": paths.target,
                   "draft_model_path": paths.draft, "eagle_head_path": paths.head,
                   "draft_reason": paths.draft_reason,
                   "drafters": InTargetSettings.parse(params)})
        if not -1 <= s.default_num_draft_tokens <= s.max_draft_tokens:
            raise SettingsError("default_num_draft_tokens must be -1 (auto) or within "
                                "0..max_draft_tokens")
        if not 1 <= s.default_max_tokens <= s.max_tokens_limit:
            raise SettingsError("default_max_tokens must be within 1..max_tokens_limit")
        if s.max_sequences < 1 or s.max_seq_len < 2 or s.queue_timeout_s < 0:
            raise SettingsError("max_sequences must be >= 1, max_seq_len >= 2, queue_timeout_s >= 0")
        if (s.spec_full_below or s.spec_off_at) and not 1 <= s.spec_full_below < s.spec_off_at:
            raise SettingsError("need 1 <= spec_full_below < spec_off_at (or both 0: no cap)")
        if s.draft_timeout_s <= 0:
            raise SettingsError("draft_timeout_s must be > 0")
        if s.default_proposer not in ("", *Proposer):
            raise SettingsError(f"default_proposer {s.default_proposer!r}: expected one of "
                                f"{', '.join(Proposer)}")
        lacks = s.default_proposer and s.missing(s.default_proposer)
        if lacks:
            raise SettingsError(f"default_proposer {s.default_proposer!r} needs {lacks}")
        if s.max_prefill_tokens < -1:
            raise SettingsError(f"max_prefill_tokens {s.max_prefill_tokens}: expected -1 (auto), "
                                f"0 (no limit) or a number of tokens")
        if not 1 <= s.ngram_min_n <= s.ngram_max_n:
            raise SettingsError("need 1 <= ngram_min_n <= ngram_max_n")
        if s.suffix_max_tokens < 0 or s.suffix_tenants not in ("shared", "separate"):
            raise SettingsError(f"suffix_max_tokens {s.suffix_max_tokens} must be >= 0 and "
                                f"suffix_tenants {s.suffix_tenants!r} shared or separate")
        return s


@dataclass(frozen=True)
class RequestLimits:
    """preprocessing: what one request may send; more is that request's INVALID_ARG, refused
    before the tokenizer runs (the bytes) or right after it (the tokens)."""
    max_input_bytes: int = 1 << 20   # text_input plus every stop word, UTF-8 bytes
    max_prompt_tokens: int = 0       # 0: only the context window (max_seq_len) bounds it
    max_stop_words: int = 64
    max_stop_word_bytes: int = 256   # one stop word, UTF-8 bytes

    @classmethod
    def parse(cls, params: dict) -> "RequestLimits":
        s = _parse(cls, params)
        if min(s.max_input_bytes, s.max_stop_words, s.max_stop_word_bytes) < 1 or \
                s.max_prompt_tokens < 0:
            raise SettingsError("max_input_bytes, max_stop_words and max_stop_word_bytes must be "
                                ">= 1, max_prompt_tokens >= 0")
        return s


@dataclass(frozen=True)
class SupervisorSettings:
    """supervisor."""
    health_interval_s: float = 2.0   # ping draft and target this often; restart one that is down

    @classmethod
    def parse(cls, params: dict) -> "SupervisorSettings":
        s = _parse(cls, params)
        if s.health_interval_s <= 0:
            raise SettingsError("health_interval_s must be > 0")
        return s


def tokenizer_path(params: dict) -> str:
    """preprocessing / postprocessing: $SPECDEC_TOKENIZER, else the target model's directory."""
    return model_paths(params).tokenizer
