"""The server's request settings, as the gateway applies them.

The gateway calls the orchestrator with token ids, past preprocessing, so preprocessing's limits
(prompt and stop-word sizes) are the gateway's to enforce, and it checks max_tokens,
num_draft_tokens and the proposer against the orchestrator's settings before a request leaves,
naming the body's own field. Both come from the same `SPECDEC_*` environment variables, read by
the same parsers the models use (a bad value stops the gateway at start, naming it). The gateway
reads no config.pbtxt: a limit set only there binds the server alone, which still refuses.
Two settings are the gateway's own (GatewaySettings): how many choices a request may ask for,
and the format tool calls are read in.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..serving.settings import OrchestratorSettings, RequestLimits, SettingsError, _parse
from .tools import SETTINGS as TOOL_PARSERS


@dataclass(frozen=True)
class GatewaySettings:
    max_n: int = 8               # choices per request, each a sequence of its own on the server
    tool_parser: str = "auto"    # auto: chosen from the chat template (tools.choose)

    @classmethod
    def parse(cls, params: dict | None = None) -> "GatewaySettings":
        s = _parse(cls, params or {})
        if s.max_n < 1:
            raise SettingsError(f"$SPECDEC_MAX_N: {s.max_n} must be >= 1")
        if s.tool_parser not in TOOL_PARSERS:
            raise SettingsError(f"$SPECDEC_TOOL_PARSER: {s.tool_parser!r} is not one of "
                                f"{', '.join(TOOL_PARSERS)}")
        return s


@dataclass(frozen=True)
class Limits:
    request: RequestLimits = field(default_factory=RequestLimits)
    server: OrchestratorSettings = field(default_factory=OrchestratorSettings)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)

    @classmethod
    def read(cls) -> "Limits":
        return cls(RequestLimits.parse({}), OrchestratorSettings.parse({}),
                   GatewaySettings.parse())
