"""`specdec probe`: does every model a request needs answer? For Kubernetes' probes.

/v2/health/ready is not enough: when a model's backend process dies, Triton keeps the model
READY and the server ready, and every request fails. The probe makes each model run a request
in its own process, without taking a sequence slot (a probe must pass on a full server):

    preprocessing   tokenizes "a"
    target_model    releases a sequence that is not open (draft_model too, with --all)
    postprocessing  detokenizes one id
    speculative_decoding (decoupled: generate only) refuses max_tokens 0 by name, so it parsed
                    the request; marked as a probe (the request parameter PARAMETER), so
                    that specdec_requests_total counts users' requests only
    supervisor      (with --all) reports the models it watches

Readiness leaves the draft out: without it requests still succeed, target-only, while the
supervisor restarts it. Liveness (--all) includes it: a draft down for longer than the liveness
threshold means the in-server restart failed, and a new container is what is left.

Standard library only: an exec probe runs every few seconds.
"""
from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request

from .. import names
from .recovery import is_down

# The release of sequence 0 in calls.py's packing (a test checks it): call INT64 [1, 12] =
# sequence id, start, k, top_k, seed, release, next_k (-1: none), drafts_in_target, next_by,
# tokens, logprobs and prompt_logprobs (-1: not asked).
_RELEASE = [{"name": names.CALL, "datatype": "INT64", "shape": [1, 12],
             "data": [0, 0, 0, 0, 0, 1, -1, 0, -1, 1, -1, -1]},
            {"name": names.SAMPLING, "datatype": "FP32", "shape": [1, 2], "data": [0.0, 1.0]},
            {"name": names.TOKENS, "datatype": "INT32", "shape": [1, 1], "data": [0]}]
INFER = {
    names.PREPROCESSING: [{"name": names.TEXT_INPUT, "datatype": "BYTES", "shape": [1],
                           "data": ["a"]}],
    names.TARGET_MODEL: _RELEASE,
    names.DRAFT_MODEL: _RELEASE,
    names.POSTPROCESSING: [
        {"name": names.OUTPUT_IDS, "datatype": "INT32", "shape": [1], "data": [0]},
        {"name": names.PREFIX_LENGTH, "datatype": "INT32", "shape": [1], "data": [0]},
        {"name": names.IS_FINAL, "datatype": "BOOL", "shape": [1], "data": [True]}],
    names.SUPERVISOR: [],
}
REQUIRED = (names.PREPROCESSING, names.TARGET_MODEL, names.POSTPROCESSING)
# A key of a generate body that is no input of the model reaches it as a request parameter.
PARAMETER = "specdec_probe"
ORCHESTRATOR_BODY = {names.INPUT_IDS: [0], names.MAX_TOKENS: 0, PARAMETER: True}
OPTIONAL = (names.DRAFT_MODEL, names.SUPERVISOR)


def _post(url: str, path: str, body: dict, timeout: float) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"{}")
        except ValueError:
            return e.code, {}


def check(url: str, model: str, timeout: float) -> str | None:
    """None when `model` ran the probe's request, else what went wrong."""
    try:
        if model == names.ORCHESTRATOR:
            status, body = _post(url, f"/v2/models/{model}/generate", ORCHESTRATOR_BODY,
                                 timeout)
            error = body.get("error", "")
            return None if names.MAX_TOKENS in error else f"{status} {error or body}"
        status, body = _post(url, f"/v2/models/{model}/infer", {"inputs": INFER[model]}, timeout)
        error = body.get("error", "")
        if status == 200 or (model == names.DRAFT_MODEL and error and not is_down(error)):
            return None   # a draft served without a checkpoint ($SPECDEC_DRAFT_MODEL=none) refuses
        if f"{model} is disabled: " in error:
            return None   # its engine runs elsewhere ($SPECDEC_TARGET_PLACEMENT): it answered
        return f"{status} {error or body}"
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


def probe(url: str, include_optional: bool, timeout: float) -> dict[str, str | None]:
    """model -> None (answered) or its problem; "server" first."""
    try:
        with urllib.request.urlopen(url + "/v2/health/ready", timeout=timeout) as r:
            ready = None if r.status == 200 else f"{r.status}"
    except (OSError, ValueError) as e:
        ready = f"{type(e).__name__}: {e}"
    result = {"server": ready}
    if ready is None:
        models = REQUIRED + (names.ORCHESTRATOR,) + (OPTIONAL if include_optional else ())
        result.update({m: check(url, m, timeout) for m in models})
    return result


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server's HTTP endpoint")
    ap.add_argument("--all", action="store_true",
                    help="also the draft and the supervisor (liveness); default: what requests need")
    ap.add_argument("--timeout", type=float, default=3.0, help="seconds per request")


def run(args) -> int:
    result = probe(args.url.rstrip("/"), args.all, args.timeout)
    for model, problem in result.items():
        print(f"{model}: {'ok' if problem is None else problem}")
    return 0 if all(p is None for p in result.values()) else 1
