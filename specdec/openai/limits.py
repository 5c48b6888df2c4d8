"""The server's request settings, as the gateway applies them.

The gateway calls the orchestrator with token ids, past preprocessing, so preprocessing's limits
(prompt and stop-word sizes) are the gateway's to enforce, and it checks max_tokens,
num_draft_tokens and the proposer against the orchestrator's settings before a request leaves,
naming the body's own field. Both come from the same `SPECDEC_*` environment variables, read by
the same parsers the models use (a bad value stops the gateway at start, naming it). The gateway
reads no config.pbtxt: a limit set only there binds the server alone, which still refuses.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..serving.settings import OrchestratorSettings, RequestLimits


@dataclass(frozen=True)
class Limits:
    request: RequestLimits = field(default_factory=RequestLimits)
    server: OrchestratorSettings = field(default_factory=OrchestratorSettings)

    @classmethod
    def read(cls) -> "Limits":
        return cls(RequestLimits.parse({}), OrchestratorSettings.parse({}))
