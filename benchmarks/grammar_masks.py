"""Which grammar engine to constrain outputs with: the time to compile a JSON schema and to
compute each position's token mask, xgrammar against llguidance, at a vocabulary of a real
model's size (128256 ids, Llama 3's), on this machine.

The vocabulary: a byte-level BPE trained here on the Python standard library (nothing is
downloaded), cached under --tokenizer. The document walked: a JSON instance of a tool-call-like
schema, tokenized; at each of its positions the mask is computed, then its token accepted.

    .venv/bin/python benchmarks/grammar_masks.py              # about a minute the first time
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


from machine import write_result

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "arguments": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"}, "hourly": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["city", "unit", "days"]}},
    "required": ["name", "arguments"],
}
DOCUMENT = json.dumps({"name": "get_weather", "arguments": {
    "city": "Reykjavik", "unit": "celsius", "days": 3, "hourly": False,
    "tags": ["wind", "rain", "aurora forecast"]}})


def tokenizer(directory: Path, vocab: int):
    from transformers import PreTrainedTokenizerFast
    if not (directory / "tokenizer.json").exists():
        import sysconfig
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        root = Path(sysconfig.get_paths()["stdlib"])
        texts = (p.read_text(encoding="utf-8", errors="replace") for p in sorted(root.rglob("*.py")))
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts, trainers.BpeTrainer(
            vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(
            directory)
    return PreTrainedTokenizerFast.from_pretrained(directory)


def walk(fill, accept, ids: list[int]) -> list[float]:
    """Seconds of each position's mask along ids, each token accepted after its mask."""
    out = []
    for t in ids:
        t0 = time.perf_counter()
        fill()
        out.append(time.perf_counter() - t0)
        accept(t)
    return out


def xgrammar_run(tok, vocab: int, ids: list[int]) -> dict:
    import xgrammar as xgr
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    t0 = time.perf_counter()
    compiled = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False).compile_json_schema(
        json.dumps(SCHEMA))
    compile_s = time.perf_counter() - t0
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, vocab)
    times = walk(lambda: matcher.fill_next_token_bitmask(mask), matcher.accept_token, ids)
    return {"compile_s": compile_s, "mask_s": times}


def llguidance_run(tok, vocab: int, ids: list[int]) -> dict:
    import llguidance
    import llguidance.hf
    import llguidance.numpy as lnp
    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    t0 = time.perf_counter()
    matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(SCHEMA)))
    compile_s = time.perf_counter() - t0
    mask = lnp.allocate_token_bitmask(1, vocab)
    times = walk(lambda: lnp.fill_next_token_bitmask(matcher, mask), matcher.consume_token, ids)
    assert not matcher.is_error(), matcher.get_error()
    return {"compile_s": compile_s, "mask_s": times}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--tokenizer", type=Path, default=Path("reports/bpe-128k"),
                    help="where the trained tokenizer is kept (trained if absent)")
    ap.add_argument("--repeats", type=int, default=5, help="walks of the document per engine")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    tok = tokenizer(args.tokenizer, args.vocab)
    vocab = max(args.vocab, len(tok))
    ids = tok(DOCUMENT)["input_ids"] + [tok.eos_token_id]
    rows = {}
    for name, run in (("xgrammar", xgrammar_run), ("llguidance", llguidance_run)):
        runs = [run(tok, vocab, ids) for _ in range(args.repeats)]
        masks = sorted(t for r in runs[1:] or runs for t in r["mask_s"])
        rows[name] = {"compile_ms": 1e3 * statistics.median(r["compile_s"] for r in runs),
                      "mask_us_p50": 1e6 * masks[len(masks) // 2],
                      "mask_us_p99": 1e6 * masks[min(len(masks) - 1, int(0.99 * len(masks)))],
                      "mask_us_mean": 1e6 * statistics.fmean(masks)}
    print(f"vocabulary {vocab} ids, document {len(ids)} tokens, {args.repeats} walks each\n")
    print("| engine | compile ms | mask us p50 | mask us p99 | mask us mean |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['compile_ms']:.1f} | {r['mask_us_p50']:.1f} | "
              f"{r['mask_us_p99']:.1f} | {r['mask_us_mean']:.1f} |")
    if args.json:
        write_result(args.json, vocab=vocab, tokens=len(ids), rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
