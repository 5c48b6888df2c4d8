"""The project's own engine and loop in this process, without Triton (specdec.decoding.local drafter
and verifier): what the model computation costs per round, so that the server's figures can be split
into compute and transport (BLS calls, stub processes, pre/postprocessing, gRPC)."""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from figures import Req, latency_summary, speedup_model
from progress import log


def engine_runs(target: Path, draft: Path, tokenizer, prompts: list[tuple[int, str]],
                ks: list[int], max_tokens: int, max_seq_len: int, dtype, device,
                warmup: int) -> list[dict]:
    """One row per K (0 = target alone), each prompt one request at a time: tokens/s,
    latencies, acceptance, the round split, and the speedup over its own target-only against
    S(a, c, K)."""
    import asyncio

    from specdec.runtime.config import ModelArgs
    from specdec.runtime.engine import Engine
    from specdec.decoding.local import LocalDrafter, LocalVerifier
    from specdec.decoding.loop import speculate
    from specdec.records import Request

    args = ModelArgs.from_dir(target)
    vocab = args.vocab_size
    tgt = Engine.load(str(target), 1, max_seq_len, dtype, device, vocab_size=vocab)
    drf = Engine.load(str(draft), 1, max_seq_len, dtype, device, vocab_size=vocab)
    ids = {i: tokenizer(p)["input_ids"] for i, p in prompts}
    seq = iter(range(1, 1 << 62))

    def one(i: int, k: int) -> tuple[Req, object]:
        times, counts = [], []
        req = Request(ids[i], max_tokens, k, eos=args.eos_token_ids)

        def emit(chunk):
            if chunk.tokens:
                times.append(time.perf_counter() - t0)
                counts.append(len(chunk.tokens))

        t0 = time.perf_counter()
        stats = asyncio.run(speculate(next(seq), req, LocalDrafter(drf), LocalVerifier(tgt),
                                      max_seq_len, emit))
        total = time.perf_counter() - t0
        return Req(i, stats.num_output_tokens, total, times[0] if times else None, times,
                   counts), stats

    rows = []
    for k in ks:
        label = f"engine in-process K={k}" if k else "engine in-process target-only"
        for j in range(warmup):
            one(prompts[j % len(prompts)][0], k)
        reqs, draft_s, verify_s, rounds, drafted, accepted = [], 0.0, 0.0, 0, 0, 0
        for i, _ in prompts:
            r, st = one(i, k)
            reqs.append(r)
            draft_s += st.draft_s
            verify_s += st.verify_s
            rounds += st.rounds
            drafted += st.total_draft_tokens
            accepted += st.total_accepted_draft_tokens
        wall = sum(r.total_s for r in reqs)
        row = {"setting": label, "k": k, "backend": "specdec engine", **latency_summary(reqs),
               "acceptance_rate": accepted / drafted if drafted else None,
               "tokens_per_round": (accepted + rounds) / rounds,
               "draft_per_token_s": draft_s / drafted if drafted else None,
               "round": {"rounds": rounds, "drafted_per_round": drafted / rounds,
                         "wall_s": wall / rounds, "draft_s": draft_s / rounds,
                         "verify_s": verify_s / rounds,
                         "overhead_s": (wall - draft_s - verify_s) / rounds},
               "per_request": [asdict(r) for r in reqs]}
        rows.append(row)
        log(f"{label}: {row['tokens_per_s']:.1f} tok/s")
    base = rows[0]
    t0_verify = base["round"]["verify_s"]
    for row in rows:
        k = row["k"]
        row["speedup_vs_own_target_only"] = row["tokens_per_s"] / base["tokens_per_s"]
        if k and row["draft_per_token_s"] is not None:
            c = row["draft_per_token_s"] / t0_verify
            row["c"] = c
            row.update(speedup_model(row["speedup_vs_own_target_only"], row["acceptance_rate"],
                                     c, k, row["tokens_per_round"]))
    return rows
