"""How long a stopping server and gateway keep serving the streams already under way.

One setting, `$SPECDEC_SHUTDOWN_GRACE_S`, read by the launcher (tritonserver's
`--exit-timeout-secs`) and by the OpenAI gateway (uvicorn's graceful shutdown): after SIGTERM
both refuse new requests and let in-flight ones finish for up to this long, then stop. The
default fits the Helm chart's terminationGracePeriodSeconds of 60 less a margin for the exit
itself; the chart sets it from that value, so the kubelet's SIGKILL never cuts a draining stream.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..serving.settings import SettingsError, _parse

ENV = "SPECDEC_SHUTDOWN_GRACE_S"
MARGIN_S = 5   # the chart's terminationGracePeriodSeconds minus this


@dataclass(frozen=True)
class ShutdownSettings:
    shutdown_grace_s: float = 55.0

    @classmethod
    def parse(cls, params: dict | None = None) -> "ShutdownSettings":
        s = _parse(cls, params or {})
        if not s.shutdown_grace_s >= 0:
            raise SettingsError(f"${ENV}: {s.shutdown_grace_s} must be >= 0")
        return s


def grace_s() -> float:
    return ShutdownSettings.parse().shutdown_grace_s
