"""benchmarks/simulated.py's figures per row and its markdown table."""
from __future__ import annotations


def _side(r: dict | None, proposer_draft: bool) -> dict | None:
    """tok/s, and per round of one sequence (ms): all of it, the draft call, the verify call
    and the rest."""
    if not r or not r["rounds"]:
        return None
    rounds = r["rounds"]
    draft = r["draft_s"] if proposer_draft else 0.0   # the head drafts inside the verify call
    return {"tok_s": r["tokens"] / r["wall_s"], "round_ms": r["request_s"] / rounds * 1e3,
            "draft_ms": draft / rounds * 1e3, "verify_ms": r["verify_s"] / rounds * 1e3,
            "outside_ms": (r["request_s"] - draft - r["verify_s"]) / rounds * 1e3,
            "tokens_per_round": r["tokens"] / rounds}


def row(mode: str, streams: int, label: str, r: dict, scale: float = 1.0) -> dict:
    """scale: the table's times were x this; the projection to x1 assumes the overhead per
    round stays what it is while the in-process round shrinks by the scale. Where the overhead
    is below minus that x1 round (the in-process side ran at the CPU's pace, not the table's),
    there is no projection: None, printed n/a."""
    draft = label.startswith("draft")
    local, served = _side(r.get("local"), draft), _side(r.get("served"), draft)
    out = {"mode": mode, "streams": streams, "setting": label, "local": local, "served": served,
           "raw": r}
    if local and served:
        out["ratio"] = served["tok_s"] / local["tok_s"]
        out["overhead_ms"] = {key: served[key] - local[key]
                              for key in ("round_ms", "draft_ms", "verify_ms", "outside_ms")}
        at_x1 = local["round_ms"] / scale
        served_x1 = at_x1 + out["overhead_ms"]["round_ms"]
        out["projected_ratio_x1"] = at_x1 / served_x1 if served_x1 > 0 else None
    for side in ("local", "served"):
        x = r.get(side)
        if x and x.get("calls"):
            out[f"{side}_calls_over_table"] = x["calls_over_table"] / x["calls"]
            if "over_s" in x:   # the time they ran past it, over all calls
                out[f"{side}_past_table_ms"] = x["over_s"] / x["calls"] * 1e3
    if r.get("served"):
        out["bls_calls_per_round"] = r["served"]["bls_calls_per_round"]
        out["target_batch"] = r["served"].get("target_batch")
        out["target_batch_sizes"] = r["served"].get("target_batch_sizes")
    out["ttft_ms"] = {side: r[side]["ttft_s"] * 1e3 for side in ("local", "served")
                      if r.get(side) and r[side].get("ttft_s") is not None}
    lo, se = r.get("local") or {}, r.get("served") or {}
    if len(out["ttft_ms"]) == 2 and lo.get("requests") and se.get("requests"):
        # of the seconds a served request took beyond its in-process twin, those before its
        # first token: a request's start, paid once, not a cost of every round
        extra = se["request_s"] / se["requests"] - lo["request_s"] / lo["requests"]
        start = (out["ttft_ms"]["served"] - out["ttft_ms"]["local"]) / 1e3
        out["start_share"] = start / extra if extra > 0 else None
    post = se.get("postprocessing")
    if post and post["responses"]:
        out["postprocessing_ms"] = {"queue": post["queue_s"] / post["responses"] * 1e3,
                                    "busy": post["busy_s"] / post["responses"] * 1e3}
    # CPU ms a served token, by process (this one's for the in-process side)
    out["cpu_ms_per_token"] = {
        side: {name: sec / r[side]["tokens"] * 1e3 for name, sec in r[side]["cpu_s"].items()}
        for side in ("local", "served")
        if r.get(side) and r[side].get("cpu_s") and r[side]["tokens"]}
    out["target_execution_ms"] = {
        side: r[side]["target_execution_s"] * 1e3 for side in ("local", "served")
        if r.get(side) and r[side].get("target_execution_s") is not None}
    # an in-target drafter's tokens, drafted a round ahead, that the round did not verify
    out["discarded_per_round"] = {
        side: r[side]["discarded"] / r[side]["rounds"] for side in ("local", "served")
        if r.get(side) and r[side].get("rounds") and "discarded" in r[side]}
    return out


def _f(x, fmt=".1f") -> str:
    return "-" if x is None else format(x, fmt)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def _sizes(sizes: dict | None) -> str:
    """{rows: executions} as "1:131 3:95": JSON keeps the keys as text."""
    return " ".join(f"{b}:{n}" for b, n in sorted((int(b), n) for b, n in sizes.items())) \
        if sizes else "-"


def table(rows: list[dict]) -> str:
    out = ["| mode | streams | setting | in-process tok/s | served tok/s | served / in-process "
           "| tokens/round | round ms in-process | round ms served | overhead ms/round "
           "| of which draft call | verify call | outside calls | served / in-process at x1, "
           "projected | BLS calls/round | drafts discarded/round in-process | served "
           "| served target rows/batch | target executions by rows "
           "| target ms an execution in-process | served "
           "| in-process calls over table | served "
           "| ms a call past the table, in-process | served |",
           "|---|---:|---|" + "---:|" * 15 + "---|" + "---:|" * 6]
    for r in rows:
        lo, se, ov = r["local"] or {}, r["served"] or {}, r.get("overhead_ms") or {}
        prop = "none" if r["setting"] == "target-only" else r["setting"].split()[0]
        calls = (r.get("bls_calls_per_round") or {}).get(prop)
        over, served_over = r.get("local_calls_over_table"), r.get("served_calls_over_table")
        x1 = "n/a" if "ratio" in r and r["projected_ratio_x1"] is None else \
            _f(r.get("projected_ratio_x1"), ".2f")
        out.append(
            f"| {r['mode']} | {r['streams']} | {r['setting']} | {_f(lo.get('tok_s'))} "
            f"| {_f(se.get('tok_s'))} | {_f(r.get('ratio'), '.2f')} "
            f"| {_f((se or lo).get('tokens_per_round'), '.2f')} "
            f"| {_f(lo.get('round_ms'))} | {_f(se.get('round_ms'))} | {_f(ov.get('round_ms'))} "
            f"| {_f(ov.get('draft_ms'))} | {_f(ov.get('verify_ms'))} "
            f"| {_f(ov.get('outside_ms'))} | {x1} "
            f"| {_f(calls, '.2f')} | {_f(r['discarded_per_round'].get('local'), '.2f')} "
            f"| {_f(r['discarded_per_round'].get('served'), '.2f')} "
            f"| {_f(r.get('target_batch'), '.2f')} "
            f"| {_sizes(r.get('target_batch_sizes'))} "
            f"| {_f(r['target_execution_ms'].get('local'))} "
            f"| {_f(r['target_execution_ms'].get('served'))} "
            f"| {_pct(over)} | {_pct(served_over)} | {_f(r.get('local_past_table_ms'), '.2f')} "
            f"| {_f(r.get('served_past_table_ms'), '.2f')} |")
    return "\n".join(out)


def cpu_table(rows: list[dict]) -> str:
    """CPU ms per token by process, in process and served, and the cores each side kept busy
    (its CPU seconds over its wall seconds)."""
    served_names = sorted({n for r in rows for n in r["cpu_ms_per_token"].get("served", {})})
    if not served_names and not any("local" in r["cpu_ms_per_token"] for r in rows):
        return ""
    out = ["| mode | streams | setting | in process | " + " | ".join(served_names)
           + " | served, all | cores busy in process | served |",
           "|---|---:|---|" + "---:|" * (len(served_names) + 4)]
    for r in rows:
        lo = r["cpu_ms_per_token"].get("local", {})
        se = r["cpu_ms_per_token"].get("served", {})
        busy = {}
        for side, ms in (("local", lo), ("served", se)):
            x = (r["raw"].get(side) or {})
            if ms and x.get("wall_s"):
                busy[side] = sum(ms.values()) * x["tokens"] / 1e3 / x["wall_s"]
        out.append(
            f"| {r['mode']} | {r['streams']} | {r['setting']} "
            f"| {_f(lo.get('in process'), '.2f')} | "
            + " | ".join(_f(se.get(n), ".2f") for n in served_names)
            + f" | {_f(sum(se.values()) if se else None, '.2f')} "
            f"| {_f(busy.get('local'), '.2f')} | {_f(busy.get('served'), '.2f')} |")
    return "\n".join(out)


def start_table(rows: list[dict]) -> str:
    """Time to first token each side, the share of the served overhead a request pays before
    it, and a streamed response's wait for and time in postprocessing (Triton's statistics)."""
    if not any(r.get("ttft_ms") or r.get("postprocessing_ms") for r in rows):
        return ""
    out = ["| mode | streams | setting | TTFT ms in-process | served | served overhead before "
           "the first token | postprocessing queue ms a response | in it |",
           "|---|---:|---|" + "---:|" * 5]
    for r in rows:
        t, p = r.get("ttft_ms") or {}, r.get("postprocessing_ms") or {}
        out.append(f"| {r['mode']} | {r['streams']} | {r['setting']} | {_f(t.get('local'))} "
                   f"| {_f(t.get('served'))} | {_pct(r.get('start_share'))} "
                   f"| {_f(p.get('queue'), '.2f')} | {_f(p.get('busy'), '.2f')} |")
    return "\n".join(out)
