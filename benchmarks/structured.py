"""What a JSON schema costs a served request: tokens per second with `response_format`'s schema
against without, at 1 and 16 streams, on one server (the default pair), the two settings
interleaved and repeated. Requests go to speculative_decoding over gRPC as the OpenAI gateway
sends them (token ids and the schema); greedy, the server's default proposer and k.

The schema holds the answer to an object whose one field is text of 600 characters at least,
so both settings write max_tokens tokens a request and the difference is the grammar's work:
walking each round's drafts, a mask per position scored, the masks applied to the target's
logits (and what the text under it does to acceptance).

    .venv/bin/python benchmarks/structured.py              # about 4 minutes on 2 CPU cores
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from inputs import DEFAULT_PROMPTS, DEFAULT_TARGET, load_prompts
from machine import write_result
from server import Server

from specdec import names
from specdec.openai.triton import SpecDecoding
from specdec.serving.tokenizer import load_tokenizer
from specdec_client import GenerationParams

# A string long enough that every answer runs to max_tokens, as the text does: the same tokens
# a request, so the rates compare the grammar's work, not shorter answers' fixed costs.
SCHEMA = json.dumps({"type": "object", "properties": {"code": {"type": "string",
                                                                "minLength": 600}},
                     "required": ["code"], "additionalProperties": False})


COUNTS = (names.NUM_OUTPUT_TOKENS, names.TOTAL_DRAFT_TOKENS, names.TOTAL_ACCEPTED_DRAFT_TOKENS)


async def run(url: str, tokenizer, prompts: list[str], streams: int, max_tokens: int,
              schema: str | None, k: int | None) -> tuple[float, dict[str, int], list[str]]:
    """(seconds, the summed counts, texts) of every prompt, `streams` at a time."""
    client = SpecDecoding(url, tokenizer)
    queue = list(enumerate(prompts))
    texts = [""] * len(prompts)
    counts = dict.fromkeys(COUNTS, 0)
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0, num_draft_tokens=k)

    async def worker():
        while queue:
            i, prompt = queue.pop(0)
            extra = {names.JSON_SCHEMA: schema} if schema else None
            async for out in client.generate(prompt, params, True, extra=extra):
                texts[i] += out.get(names.TEXT_OUTPUT, "")
                if out.get(names.FINISH_REASON):
                    for name in COUNTS:
                        counts[name] += out.get(name) or 0
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(streams)))
    return time.perf_counter() - t0, counts, texts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--streams", default="1,16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ks", default="0,-1", help="num_draft_tokens to run (-1: auto, the default)")
    ap.add_argument("--json", type=Path, default=Path("reports/structured.json"))
    args = ap.parse_args(argv)
    prompts = load_prompts(DEFAULT_PROMPTS, args.prompts)
    tokenizer = load_tokenizer(str(DEFAULT_TARGET))
    rows = []
    settings = (("text", None), ("json_schema", SCHEMA))
    with Server() as server:
        for name, schema in settings:   # warm-up, and the schema compiled
            asyncio.run(run(server.grpc_url, tokenizer, prompts[:2], 1, 8, schema, None))
        for streams in (int(s) for s in args.streams.split(",")):
            for k in (int(k) for k in args.ks.split(",")):
                for rep in range(args.repeats):
                    for name, schema in settings[::1 if rep % 2 == 0 else -1]:
                        s, c, texts = asyncio.run(run(server.grpc_url, tokenizer, prompts,
                                                      streams, args.max_tokens, schema, k))
                        if schema:   # every answer is the schema's object, or cut short
                            assert all(t.startswith('{"code": "') for t in texts), texts[:2]
                        n = c[names.NUM_OUTPUT_TOKENS]
                        rows.append({"streams": streams, "k": k, "setting": name, "repeat": rep,
                                     "seconds": s, **c, "tokens_per_s": n / s})
                        print(f"{streams:>3} streams  k {k:>2}  {name:<12} repeat {rep}: "
                              f"{n / s:7.1f} tok/s", flush=True)
    print("\n| streams | num_draft_tokens | text tok/s | json_schema tok/s | json_schema / text "
          "| accepted a drafted token, text / json_schema |")
    print("|---:|---:|---:|---:|---:|---|")
    for streams, k in sorted({(r["streams"], r["k"]) for r in rows}):
        of = {name: [r for r in rows if (r["streams"], r["k"], r["setting"]) ==
                     (streams, k, name)] for name, _ in settings}
        rate = {name: sum(r["tokens_per_s"] for r in rs) / len(rs) for name, rs in of.items()}
        acc = {name: sum(r[names.TOTAL_ACCEPTED_DRAFT_TOKENS] for r in rs) /
               max(1, sum(r[names.TOTAL_DRAFT_TOKENS] for r in rs)) for name, rs in of.items()}
        print(f"| {streams} | {'auto' if k < 0 else k} | {rate['text']:.1f} | "
              f"{rate['json_schema']:.1f} | {rate['json_schema'] / rate['text']:.2f}x | "
              f"{acc['text']:.2f} / {acc['json_schema']:.2f} |")
    write_result(args.json, schema=SCHEMA, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
