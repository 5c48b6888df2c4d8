"""The same requests through a real tritonserver (the ensemble over gRPC streaming, or
`specdec openai` in front of it) whose engines are padded to the simulated device
($SPECDEC_SIMULATE)."""
from __future__ import annotations

import queue
import time

from clients import GrpcClient, run_streams
from gateway import Gateway, OpenAIClient
from progress import log
from server import (POSTPROCESSING, TARGET, TRITON_PHASES, Server, process_cpu_s,
                    settle_metrics)
from sim_plan import Mode, Setting, seed_of


class SampledClient(GrpcClient):
    """GrpcClient with the mode's temperature and the prompt's seed."""

    def __init__(self, url: str, mode: Mode):
        super().__init__(url)
        self.mode = mode

    def _inputs(self, prompt, k, max_tokens, proposer):
        from specdec_client import GenerationParams
        from specdec_client.grpc_transport import build_infer_inputs
        sampled = self.mode.temperature > 0
        return build_infer_inputs(prompt, GenerationParams(
            max_tokens=max_tokens, temperature=self.mode.temperature,
            seed=seed_of(prompt) if sampled else None, num_draft_tokens=k, proposer=proposer),
            True, self.ranks)


class SampledOpenAIClient(OpenAIClient):
    """OpenAIClient with the mode's temperature and the prompt's seed: streamed completions
    through the gateway, which calls speculative_decoding with token ids (no ensemble)."""

    def __init__(self, gateway: Gateway, mode: Mode):
        super().__init__(gateway)
        self.mode = mode

    def body(self, prompt, k, max_tokens, proposer):
        body = {**super().body(prompt, k, max_tokens, proposer),
                "temperature": self.mode.temperature}
        return {**body, "seed": seed_of(prompt)} if self.mode.temperature > 0 else body


def start(args, max_sequences: int, max_seq_len: int, placement: str = "auto") -> Server:
    """TMPDIR: the run's own simulated device (its lock file), shared by draft_model and
    target_model, not with whatever else on the machine simulates one. No table: no padding."""
    env = {"TMPDIR": str(args.device_dir), "SPECDEC_EAGLE_HEAD": str(args.head)}
    if args.table is not None:   # none: the engines on the machine's own device, unpadded
        env |= {"SPECDEC_SIMULATE": str(args.table), "SPECDEC_SIMULATE_SCALE": str(args.scale),
                "SPECDEC_SIMULATE_SHARED": "0" if args.own_draft_device else "1",
                "SPECDEC_SIMULATE_STATS": str(args.device_dir)}
    if placement == "orchestrator":   # the target's engine, the draft beside it, hosted
        env |= {"SPECDEC_DRAFT_PLACEMENT": "target", "SPECDEC_TARGET_PLACEMENT": "orchestrator"}
    elif placement != "auto":   # auto: the server's defaults (hosted, an unsharded target)
        env |= {"SPECDEC_DRAFT_PLACEMENT": placement, "SPECDEC_TARGET_PLACEMENT": "separate"}
    server = Server(args.target, args.draft, max_sequences, max_seq_len, env=env)
    # Hosted, target_model executes nothing but the supervisor's pings, which it refuses.
    server.hosted = placement in ("auto", "orchestrator")
    server.device_dir = args.device_dir
    return server


def _ratio(d: dict, a: str, b: str) -> float | None:
    return d[a] / d[b] if d.get(b) else None


def _published(server: Server) -> dict[str, float]:
    """The served engines' simulated-device counts, once their last calls are published."""
    from specdec.hooks import simulate
    time.sleep(2 * simulate.PUBLISH_S)
    return simulate.published(server.device_dir)


def _send(make_client, prompts: list[str], setting: Setting, max_tokens: int,
          streams: int) -> tuple[list, float]:
    todo: queue.Queue = queue.Queue()
    for i, p in enumerate(prompts):
        todo.put((i, p))
    done, errors = [], []

    def worker(client):
        try:
            while not errors:
                try:
                    i, p = todo.get_nowait()
                except queue.Empty:
                    return
                done.append(client.request(p, i, setting.k, max_tokens, setting.proposer))
        except BaseException as e:   # reported after the other streams stop
            errors.append(e)
        finally:
            client.close()

    wall = run_streams([make_client() for _ in range(streams)], worker, errors, setting.label)
    return done, wall


def run(server: Server, prompts: list[str], setting: Setting, mode: Mode, max_tokens: int,
        streams: int, gateway: Gateway | None = None) -> dict:
    """gateway: through `specdec openai` in front of server, else the ensemble over gRPC."""
    before, (sizes_before, compute_before) = server.metrics(), server.batch_stats(TARGET)
    post_before = server.model_stats((POSTPROCESSING,))[POSTPROCESSING]
    sim_before = _published(server)
    cpu_before, client_before = server.cpu_seconds(), time.process_time()
    gateway_before = process_cpu_s(gateway.proc.pid) if gateway else 0.0
    make = (lambda: SampledOpenAIClient(gateway, mode)) if gateway else (
        lambda: SampledClient(server.grpc_url, mode))
    reqs, wall = _send(make, prompts, setting, max_tokens, streams)
    # CPU seconds of each server process and of this one (the streams' client threads): on
    # a GPU host, where the compute leaves the cores to serving, which process is busy
    cpu = {name: s - cpu_before.get(name, 0.0) for name, s in server.cpu_seconds().items()}
    cpu["client"] = time.process_time() - client_before
    if gateway:
        cpu["gateway"] = process_cpu_s(gateway.proc.pid) - gateway_before
    sim = {key: value - sim_before[key] for key, value in _published(server).items()}
    tokens = sum(r.tokens for r in reqs)
    d = settle_metrics(server, before, tokens)
    per_round = server.by_label("specdec_bls_calls_per_round", "proposer")
    sizes_after, compute_after = server.batch_stats(TARGET)
    sizes = {} if server.hosted else {b: n - sizes_before.get(b, 0)
                                      for b, n in sorted(sizes_after.items())}
    executions = sum(sizes.values())
    post = {key: n - post_before[key]
            for key, n in server.model_stats((POSTPROCESSING,))[POSTPROCESSING].items()}
    ttfts = [r.ttft_s for r in reqs if r.ttft_s is not None]
    out = {"tokens": tokens, "wall_s": wall, "request_s": sum(r.total_s for r in reqs),
           "rounds": d.get("specdec_rounds_total", 0.0),
           "draft_s": d.get("specdec_draft_latency_seconds_sum", 0.0),
           "draft_calls": d.get("specdec_draft_latency_seconds_count", 0.0),
           "verify_s": d.get("specdec_verify_latency_seconds_sum", 0.0),
           "verify_calls": d.get("specdec_verify_latency_seconds_count", 0.0),
           "drafted": d.get("specdec_draft_tokens_total", 0.0),
           "discarded": d.get("specdec_discarded_draft_tokens_total", 0.0),
           "accepted": d.get("specdec_accepted_tokens_total", 0.0),
           "bls_calls_per_round": per_round,
           # calls whose real CPU compute outran the simulated time, and by how much: on a
           # host short of cores the server's other processes slow the tiny models' compute
           "calls_over_table": sim["over"], "calls": sim["calls"], "over_s": sim["over_s"],
           # the target's rows per execution (in process a round's rows make one batch):
           # target_model's from Triton's statistics, a hosted engine's from its counters
           "target_batch": sum(b * n for b, n in sizes.items()) / executions
           if executions else _ratio(d, "specdec_target_batch_rows_total",
                                     "specdec_target_batches_total") if server.hosted else None,
           "target_batch_sizes": {b: n for b, n in sizes.items() if n},
           "cpu_s": cpu,
           "requests": len(reqs), "ttft_s": sum(ttfts) / len(ttfts) if ttfts else None,
           # every streamed response passes through postprocessing's one instance in turn:
           # its wait there and its time in it, summed over the run's responses
           "postprocessing": {"responses": post["count"], "queue_s": post["queue"] / 1e9,
                              "busy_s": sum(post[k] for k in TRITON_PHASES[1:]) / 1e9},
           # against a target call in process: the device's time, or the CPU's
           "target_execution_s": (compute_after - compute_before) / executions
           if executions else None}
    via = " through the gateway" if gateway else ""
    log(f"served {mode.name} x{streams} {setting.label}{via}: {tokens / wall:.1f} tok/s")
    return out
