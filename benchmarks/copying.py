"""Does the target copy from its context? What prompt lookup needs from it, measured directly.

Two teacher-forced figures, the target's top-1 next-token accuracy:
- random tokens, repeated: on the second copy of a random sequence (induction; a model that
  copies gets near 1, one that does not gets about 0);
- the repeating workload's functions written out twice: on the second copy against the first.
  Copying shows as the second copy predicted much better than the first.

    .venv/bin/python benchmarks/copying.py [--target DIR]
"""
from __future__ import annotations

import argparse
import sys

import torch

from inputs import DEFAULT_TARGET, load_prompts, load_tokenizer
from workloads import REPEATING


def top1(model, ids: list[int], start: int, end: int) -> tuple[int, int]:
    """(right, total): argmax predictions of ids[start:end] from what precedes each."""
    with torch.no_grad():
        pred = model(torch.tensor([ids])).logits[0].argmax(-1)
    right = (pred[start - 1:end - 1] == torch.tensor(ids[start:end])).sum().item()
    return right, end - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--sequences", type=int, default=20)
    ap.add_argument("--length", type=int, default=30)
    args = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM
    tok = load_tokenizer(args.target)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    n = args.length
    right = total = 0
    for _ in range(args.sequences):
        r = torch.randint(len(tok) // 10, len(tok), (n,), generator=gen).tolist()
        a, b = top1(model, r + r, n + 1, 2 * n)
        right, total = right + a, total + b
    print(f"random tokens repeated: top-1 on the second copy {right / total:.2f} "
          f"({args.sequences} sequences of {n})")
    first = second = [0, 0]
    for prompt in load_prompts(REPEATING, 10**6, strict=False):
        body = tok(prompt.partition("\n\n\n")[0])["input_ids"]
        sep = tok("\n\n\n")["input_ids"]
        ids = body + sep + body
        a = top1(model, ids, 1, len(body))
        b = top1(model, ids, len(body) + len(sep) + 1, len(ids))
        first = [first[0] + a[0], first[1] + a[1]]
        second = [second[0] + b[0], second[1] + b[1]]
    print(f"workload functions written twice: top-1 {first[0] / first[1]:.2f} on the first copy, "
          f"{second[0] / second[1]:.2f} on the second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
