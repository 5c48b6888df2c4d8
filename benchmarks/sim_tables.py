"""Simulated cost tables (specdec/hooks/simulate.py) for an 8B target (Llama-3.1-8B's shapes) with a
1B draft model (Llama-3.2-1B's) and with an EAGLE-3 head, on an H100 SXM in bf16 with CUDA graphs.
Derived, not measured: each forward costs a fixed floor plus the larger of its memory traffic (the
weights it reads once, the KV cache its rows read at `context` tokens) over the effective bandwidth
and its matmul FLOPs over the effective bf16 throughput (a roofline). The checks against public
batch-1 figures print beside the tables. docs/simulated.md explains the model.

    .venv/bin/python benchmarks/sim_tables.py            # writes benchmarks/sim/h100-8b-*.json
    # from your own GPU: costs.py measures the same quantities; make a table of its result
    python3 benchmarks/costs.py --pair /tmp/rp --batches 1,4,16 --json costs.json
    python3 benchmarks/sim_tables.py --from-costs costs.json --prefill-ms-per-token 0.025,0.004 \\
        --out benchmarks/sim/my-gpu.json
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
FORMAT = "specdec-simulated-costs/1"

# H100 SXM5 80 GB: HBM3 3.35 TB/s, dense bf16 989 TFLOP/s (NVIDIA's datasheet).
BANDWIDTH = 3.35e12
FLOPS = 989e12
BW_FRACTION = 0.75      # what a decode step's GEMVs reach of the peak bandwidth (assumed)
FLOP_FRACTION = 0.6     # what small-M bf16 GEMMs reach of the peak (assumed)
FLOOR_MS = 0.15         # per forward, CUDA graph replay: launch, kernel tails, sampling, one sync
BYTES = 2               # bf16
BATCHES = (1, 2, 4, 8, 16, 32)
KS = tuple(range(1, 9))
CONTEXT = 512

# Public batch-1 figures the derivation is checked against (ms).
CHECKS = {"target step": (6.33, "SGLang: 158 tok/s, Llama-3.1-8B-Instruct, H100, batch 1"),
          "draft step": (1.25, "1B draft step with CUDA graphs: about 1-1.5 ms"),
          "head step": (1.0, "EAGLE-3 head step: well under 1 ms")}


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    qkv_in: int = 0     # an EAGLE-3 layer's q, k, v read [embedding, feature]: 2 x hidden
    fc_in: int = 0      # an EAGLE-3 head's fc over 3 target layers (read on the catch-up only)

    def layer_params(self) -> int:
        qkv_in = self.qkv_in or self.hidden
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return qkv_in * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate

    def matmul_params(self) -> int:
        """Weights every forward reads: the layers and the LM head (an embedding lookup reads
        a row per token, nothing)."""
        return self.layers * self.layer_params() + self.vocab * self.hidden

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * BYTES


LLAMA_8B = Shape(32, 4096, 32, 8, 128, 14336, 128256)
LLAMA_1B = Shape(16, 2048, 32, 8, 64, 8192, 128256)
# EAGLE-3 head for Llama-3.1-8B: one layer, a 32000-token draft vocabulary.
EAGLE_8B = Shape(1, 4096, 32, 8, 128, 14336, 32000, qkv_in=2 * 4096, fc_in=3 * 4096)


def forward_ms(s: Shape, rows: int, tokens: int, context: int, extra_params: int = 0) -> float:
    """One forward of `rows` rows of `tokens` new tokens each over `context` cached ones."""
    params = s.matmul_params() + extra_params
    traffic = params * BYTES + rows * (context + tokens) * s.kv_bytes_per_token()
    attention_flops = 4 * rows * tokens * (context + tokens) * s.heads * s.head_dim * s.layers
    flops = 2 * params * rows * tokens + attention_flops
    return FLOOR_MS + 1e3 * max(traffic / (BANDWIDTH * BW_FRACTION),
                                flops / (FLOPS * FLOP_FRACTION))


def prefill_ms_per_token(s: Shape) -> float:
    """A long prompt is compute-bound: its matmul FLOPs per token at the effective throughput."""
    return 1e3 * 2 * s.matmul_params() / (FLOPS * FLOP_FRACTION)


def target_row(b: int, context: int) -> dict:
    return {"step_ms": forward_ms(LLAMA_8B, b, 1, context),
            "verify_ms": {k: forward_ms(LLAMA_8B, b, k + 1, context) for k in KS}}


def propose_ms(b: int, k: int, context: int) -> float:
    """k draft forwards: the first feeds the committed tokens (one, or up to K + 1 after a
    round that accepted everything: costed as one), each later one a drafted token."""
    return sum(forward_ms(LLAMA_1B, b, 1, context + j) for j in range(k))


def head_ms(b: int, k: int, context: int) -> float:
    """The head's part of a verification: a catch-up forward over the round's positions
    (reading fc too) that drafts the first token, then k - 1 one-token steps."""
    catch_up = forward_ms(EAGLE_8B, b, k + 1, context, EAGLE_8B.fc_in * EAGLE_8B.hidden)
    return catch_up + sum(forward_ms(EAGLE_8B, b, 1, context + j) for j in range(1, k))


def derived(kind: str, context: int) -> dict:
    batches = {}
    for b in BATCHES:
        row = target_row(b, context)
        if kind in ("draft", "both"):
            row["propose_ms"] = {k: propose_ms(b, k, context) for k in KS}
        if kind in ("head", "both"):
            row["head_verify_ms"] = {k: row["verify_ms"][k] + head_ms(b, k, context) for k in KS}
        batches[str(b)] = {key: ({str(k): round(v, 4) for k, v in val.items()}
                                 if isinstance(val, dict) else round(val, 4))
                           for key, val in row.items()}
    pre = {"target": round(prefill_ms_per_token(LLAMA_8B), 5)}
    if kind in ("draft", "both"):
        pre["draft"] = round(prefill_ms_per_token(LLAMA_1B), 5)
    return {
        "format": FORMAT, "simulated": True,
        "device": "NVIDIA H100 SXM, bf16, CUDA graphs (SIMULATED)",
        "target": "Llama-3.1-8B shapes",
        "draft": "Llama-3.2-1B shapes" if kind in ("draft", "both") else None,
        "head": "EAGLE-3 head for Llama-3.1-8B (1 layer, 32000-token draft vocabulary)"
        if kind in ("head", "both") else None,
        "context": context,
        "derivation": (f"benchmarks/sim_tables.py: per forward {FLOOR_MS} ms + max(bytes / "
                       f"({BANDWIDTH / 1e12} TB/s x {BW_FRACTION}), FLOPs / ({FLOPS / 1e12:.0f} "
                       f"TFLOP/s x {FLOP_FRACTION})); docs/simulated.md"),
        "prefill_ms_per_token": pre, "batches": batches}


def checks(context: int) -> list[str]:
    got = {"target step": forward_ms(LLAMA_8B, 1, 1, context),
           "draft step": forward_ms(LLAMA_1B, 1, 1, context),
           "head step": forward_ms(EAGLE_8B, 1, 1, context)}
    out = []
    for name, ms in got.items():
        ref, source = CHECKS[name]
        out.append(f"{name}: {ms:.2f} ms (public: {source}; {ms / ref:.2f}x of {ref} ms)")
    v4 = forward_ms(LLAMA_8B, 1, 5, context) / got["target step"]
    out.append(f"verify of K+1 = 5 tokens: {v4:.3f} target steps (public: about one step)")
    r = propose_ms(1, 4, context) + forward_ms(LLAMA_8B, 1, 5, context)
    out.append(f"a draft-model round at K=4 (propose 4 + verify 5): {r:.1f} ms (about 12 ms)")
    return out


def from_costs(path: Path, prefill: list[float], run: str | None) -> dict:
    """A table from benchmarks/costs.py --json: its per-batch figures as they are (one run:
    'CUDA graphs on' when it has it)."""
    data = json.loads(path.read_text())
    runs = data["runs"]
    name = run or ("CUDA graphs on" if "CUDA graphs on" in runs else next(iter(runs)))
    keep = ("step_ms", "verify_ms", "propose_ms", "head_verify_ms")
    batches = {b: {k: v for k, v in row.items() if k in keep} for b, row in runs[name].items()}
    # The batch-invariant arithmetic is the target's alone (costs.py times no draft under it):
    # the draft's proposals are those of the same run without it.
    plain = runs.get(name.replace(", invariant", ""), {})
    for b, row in batches.items():
        if "propose_ms" not in row and "propose_ms" in plain.get(b, {}):
            row["propose_ms"] = plain[b]["propose_ms"]
    pre = {"target": prefill[0]}
    if len(prefill) > 1:
        pre["draft"] = prefill[1]
    return {"format": FORMAT, "simulated": True,
            "device": f"{data['device']}, {data['dtype']}, {name} (measured by costs.py)",
            "target": data["target"], "draft": data["draft"], "head": data["head"],
            "context": data["context"], "derivation": f"benchmarks/costs.py result {path}",
            "prefill_ms_per_token": pre, "batches": batches}


def write(table: dict, out: Path) -> None:
    from specdec.hooks.simulate import parse_table
    parse_table(table, str(out))           # never write a table the loader refuses
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {out}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=CONTEXT, help="cached tokens per row")
    ap.add_argument("--out-dir", type=Path, default=HERE / "sim")
    ap.add_argument("--from-costs", type=Path, help="a benchmarks/costs.py --json result")
    ap.add_argument("--prefill-ms-per-token", default="",
                    help="with --from-costs: TARGET[,DRAFT] ms a prompt token costs")
    ap.add_argument("--run", help="with --from-costs: which run (default: CUDA graphs on)")
    ap.add_argument("--out", type=Path, help="with --from-costs: the table to write")
    args = ap.parse_args(argv)
    if args.from_costs:
        if not args.out or not args.prefill_ms_per_token:
            ap.error("--from-costs needs --out and --prefill-ms-per-token")
        prefill = [float(x) for x in args.prefill_ms_per_token.split(",")]
        write(from_costs(args.from_costs, prefill, args.run), args.out)
        return 0
    for line in checks(args.context):
        print(line)
    write(derived("draft", args.context), args.out_dir / "h100-8b-1b.json")
    write(derived("head", args.context), args.out_dir / "h100-8b-eagle.json")
    # Both beside one target, for a server with a draft model and a head (simulated.py).
    write(derived("both", args.context), args.out_dir / "h100-8b-1b-eagle.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
