"""Where a verification of K+1 tokens first scores a token otherwise than the one-token step did,
on this device and dtype, module by module: the bisect for docs/exactness.md's open case (on an
H200 in bf16, 2 of 16 prompts left target-only's text at K = 2 with the invariance on).

The default target (or --target), 16 held-out prompts batched: first target-only greedy, one
token a step; then the same rows replayed at K, each round's drafts the reference's own next K
tokens, all 16 rows at K + 1 tokens a call, as exactness.py's K = 2 runs are. Every drafted
token must be accepted and every bonus token be the reference's. At the first (row, position)
where one is not, with CUDA graphs off, forward hooks record every module's output for that
token in the step and in the verification, and the first module whose row differs is printed.

    python3 benchmarks/invariance_bisect.py --device cuda --k 2 --json $OUT/bisect.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from exactness import prompts

from specdec.runtime.engine import Engine
from specdec.records import VerifyCall
from specdec.runtime.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]

GREEDY = SamplingParams()


class Recorder:
    """Each module's input and output at row `row`, token `token`, while armed, in call
    order."""

    def __init__(self, model: torch.nn.Module):
        self.armed, self.row, self.token, self.seen = False, 0, 0, []
        for name, m in model.named_modules():
            if name:
                m.register_forward_hook(self._hook(name))

    def _hook(self, name: str):
        # Inputs too: attention's kernel is no module, its result first shows as o_proj's input.
        def hook(_module, inputs, out):
            out = out[0] if isinstance(out, tuple) else out
            for label, x in ((f"{name} input", inputs[0] if inputs else None), (name, out)):
                if self.armed and isinstance(x, torch.Tensor) and x.dim() >= 3:
                    self.seen.append((label, x[self.row, self.token].detach().float().cpu()))
        return hook


def reference(engine: Engine, ps: list[list[int]], n: int) -> list[list[int]]:
    """Target-only greedy: the prefill's token, then n one-token steps per row."""
    ids = list(range(len(ps)))
    out = [[v.tokens[0]] for v in engine.verify([VerifyCall(i, 0, p, [], None, GREEDY)
                                                 for i, p in zip(ids, ps)])]
    for j in range(n):
        calls = [VerifyCall(i, len(p) + j, [o[-1]], [], None, GREEDY)
                 for i, p, o in zip(ids, ps, out)]
        for o, v in zip(out, engine.verify(calls)):
            o.append(v.tokens[0])
    engine.release(ids)
    return out


def replay(engine: Engine, ps, ref, k: int, stop_at=None):
    """Rounds of K reference drafts; the first (row, position in the output, token index in the
    call) whose verdict is not the reference's, or None. stop_at: arm the recorder there."""
    ids = list(range(len(ps)))
    engine.verify([VerifyCall(i, 0, p, [], None, GREEDY) for i, p in zip(ids, ps)])
    at = 0                       # every row has ref[:at + 1] committed, ref[:at] cached past p
    found = None
    while at + k + 1 < len(ref[0]) and found is None:
        calls = [VerifyCall(i, len(p) + at, [r[at]], r[at + 1:at + 1 + k], None, GREEDY)
                 for i, p, r in zip(ids, ps, ref)]
        if stop_at is not None and at + 1 + stop_at[2] == stop_at[1]:
            stop_at[3].armed, stop_at[3].row, stop_at[3].token = True, stop_at[0], stop_at[2]
        verdicts = engine.verify(calls)
        if stop_at is not None:
            stop_at[3].armed = False
        for i, v in enumerate(verdicts):
            want = ref[i][at + 1:at + k + 2]
            if v.tokens != want:
                j = next(x for x, (a, b) in enumerate(zip(v.tokens, want)) if a != b)
                found = (i, at + 1 + j, j)     # the token scored at index j of the call
                break
        at += k + 1
    engine.release(ids)
    return found


def bisect(engine: Engine, ps, ref, k: int, found) -> tuple:
    """(the first module whose output for the token differs between its step and the
    verification, its largest difference), and how many modules were compared. Graphs off."""
    rec = Recorder(engine.model)
    row, pos, index = found
    # The step that scored output token `pos` fed token pos - 1 at position len(p) + pos - 1.
    rec.row, rec.token = row, 0
    ids = list(range(len(ps)))
    engine.verify([VerifyCall(i, 0, p, [], None, GREEDY) for i, p in zip(ids, ps)])
    for j in range(pos):
        rec.armed = j == pos - 1
        engine.verify([VerifyCall(i, len(p) + j, [r[j]], [], None, GREEDY)
                       for i, p, r in zip(ids, ps, ref)])
    rec.armed = False
    engine.release(ids)
    step, rec.seen = rec.seen, []
    replay(engine, ps, ref, k, stop_at=(row, pos, index, rec))
    verify = rec.seen
    first = next(((n1, (x - y).abs().max().item()) for (n1, x), (n2, y) in zip(step, verify)
                  if n1 == n2 and not torch.equal(x, y)), None)
    return first, min(len(step), len(verify))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--target", type=Path, default=ROOT / "models" / "default" / "target")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--invariant", choices=("on", "off"), default="on",
                    help="off: the plain arithmetic, whose differences the bisect then shows")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    ps = prompts(a.prompts)
    max_len = max(map(len, ps)) + a.max_tokens + a.k + 4
    result: dict = {"k": a.k, "dtype": a.dtype, "device": str(device)}
    graph_settings = (True, False) if device.type == "cuda" else (False,)
    for graphs in graph_settings:
        engine = Engine.load(str(a.target), len(ps), max_len, dtype, device,
                             batch_invariant=a.invariant == "on",
                             cuda_graphs=graphs)
        ref = reference(engine, ps, a.max_tokens)
        found = replay(engine, ps, ref, a.k)
        key = f"graphs {'on' if graphs else 'off'}"
        result[key] = found
        print(f"{key}: " + ("every verification agrees with the one-token steps" if found is None
                            else f"row {found[0]}, output token {found[1]} (index {found[2]} of "
                                 f"its call) differs"), flush=True)
        if found is None or graphs:
            continue
        first, compared = bisect(engine, ps, ref, a.k, found)
        result["first_module"], result["modules_compared"] = first, compared
        print(f"first module whose output differs: {first} ({compared} compared)", flush=True)
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
