"""The project's engine and loop in this process (specdec.decoding.local, no Triton), on the
simulated device: the same requests a served run sends, batched as Triton's dynamic batcher would.
What is left between this and the served run is the server's orchestration."""
from __future__ import annotations

import asyncio
import itertools
import os
import time

from progress import log
from sim_plan import AUTO, MAX_DRAFT_TOKENS, Mode, Setting, seed_of


def _proposer(name: str):
    from specdec.records import Proposer
    return Proposer(name)


def _on_cpu(args, max_sequences: int, max_seq_len: int, margs):
    """Target (with the head) and draft in float32 on the CPU, to be padded to the table."""
    import torch

    from specdec.runtime.engine import Engine
    from specdec.proposers.eagle.checkpoint import HeadCheckpoint
    cpu = torch.device("cpu")
    # As the server gives each model (settings.threads): spinning OpenMP threads on a shared
    # CPU cost more than the simulated step itself.
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    return (Engine.load(str(args.target), max_sequences, max_seq_len, torch.float32, cpu,
                        vocab_size=margs.vocab_size, head=HeadCheckpoint(str(args.head))),
            Engine.load(str(args.draft), max_sequences, max_seq_len, torch.float32, cpu,
                        vocab_size=margs.vocab_size))


def _as_served(args, max_sequences: int, max_seq_len: int, margs):
    """Target (with the head) and draft as target_model and draft_model load them by default:
    the settings' device and dtype (CUDA and bf16 where there is a GPU), CUDA graphs there,
    the target's batch-invariant arithmetic where the settings turn it on."""
    import torch

    from specdec.runtime.engine import Engine
    from specdec.proposers.eagle.checkpoint import HeadCheckpoint
    from specdec.serving.engine_settings import EngineSettings
    s = EngineSettings(str(args.target), str(args.target), max_sequences, max_seq_len)
    device, dtype = s.torch_device(), s.torch_dtype()
    if device.type == "cpu":
        torch.set_num_threads(s.threads())
    common = dict(vocab_size=margs.vocab_size, attention_kind=s.attention,
                  cuda_graphs=s.cuda_graphs and device.type == "cuda")
    return (Engine.load(str(args.target), max_sequences, max_seq_len, dtype, device,
                        head=HeadCheckpoint(str(args.head)),
                        batch_invariant=s.invariant("target", dtype),
                        **common),
            Engine.load(str(args.draft), max_sequences, max_seq_len, dtype, device, **common))


def colocated(args) -> bool:
    """The draft drafts inside the target's call in process, as the served default places it,
    unless every served placement keeps it apart (separate, or a device of its own)."""
    return not args.own_draft_device and any(p != "separate" for p in args.placement_list)


class Local:
    """Target (with the head) and draft engines padded to the table, or with no table
    (--table none) unpadded on the machine's own device, as the server loads them; the draft
    in the target's call where the served side places it there (colocated), else apart."""

    def __init__(self, args, max_sequences: int, max_seq_len: int):
        from specdec.hooks import simulate
        from specdec.runtime.config import ModelArgs
        from specdec.proposers.colocated import ColocatedDraft
        from specdec.decoding.local import LocalDrafter, LocalVerifier
        from specdec.proposers.ngram import NgramProposer
        from specdec.planning.planner import Planner
        from specdec.records import IN_TARGET, Proposer
        margs = ModelArgs.from_dir(args.target)
        self.colocated = colocated(args)
        if args.table is None:   # this machine's own device, as the server loads it
            self.target, self.draft = _as_served(args, max_sequences, max_seq_len, margs)
            for engine in (self.target, self.draft):   # as the server does before it is ready
                engine.capture_graphs()
            if self.colocated:
                self.target.add_drafter(Proposer.DRAFT, ColocatedDraft(self.draft))
        else:
            table = simulate.load_table(args.table, args.scale)
            # One process calls one engine at a time, so the shared device changes nothing
            # here; held all the same, as the served side holds it.
            device = None if args.own_draft_device else \
                simulate.Device(args.device_dir / simulate.LOCK_NAME)
            target, draft = _on_cpu(args, max_sequences, max_seq_len, margs)
            if self.colocated:   # padded inside the verification, as target_model pads it
                target.add_drafter(Proposer.DRAFT, ColocatedDraft(draft))
            self.target = simulate.pad(target, table, "target", device)
            self.draft = draft if self.colocated else simulate.pad(draft, table, "draft", device)
        self.verifier = LocalVerifier(self.target)
        self.drafter = None if self.colocated else LocalDrafter(self.draft)
        self.eos, self.max_seq_len = margs.eos_token_ids, max_seq_len
        self.planner = Planner(MAX_DRAFT_TOKENS, None, proposers=tuple(
            _proposer(p) for p in ("draft", "ngram", "eagle")),
            in_target=IN_TARGET + ((Proposer.DRAFT,) if self.colocated else ()))
        self.ngram = NgramProposer
        self.seq = itertools.count(1)

    def request(self, ids: list[int], text: str, setting: Setting, mode: Mode, max_tokens: int):
        from specdec.records import Request
        from specdec.runtime.sampling import SamplingParams
        sampled = mode.temperature > 0
        sampling = SamplingParams(temperature=mode.temperature,
                                  seed=seed_of(text) if sampled else 0)
        k = MAX_DRAFT_TOKENS if setting.k == AUTO else setting.k
        return Request(ids, max_tokens, k, sampling, eos=self.eos, auto=setting.k == AUTO,
                       reproducible=sampled, proposer=_proposer(setting.proposer or "draft"))

    def run(self, prompts: list[tuple[list[int], str]], setting: Setting, mode: Mode,
            max_tokens: int, streams: int) -> dict:
        """All prompts through `streams` concurrent sequences: tokens, wall, per-request
        seconds, rounds, and the loop's draft and verify seconds."""
        from specdec.decoding.loop import open_policy, speculate
        todo = iter(prompts)
        reqs: list[tuple[float, object]] = []
        ttfts: list[float] = []
        discarded = [0]   # an in-target drafter's tokens that their round did not verify

        def on_round(r) -> None:
            discarded[0] += r.discarded

        async def worker():
            for ids, text in todo:
                req = self.request(ids, text, setting, mode, max_tokens)
                policy = open_policy(self.planner, req)
                t0 = time.perf_counter()
                first: list[float] = []   # when the first token came

                def emit(chunk, first=first, t0=t0) -> None:
                    if chunk.tokens and not first:
                        first.append(time.perf_counter() - t0)
                try:
                    stats = await speculate(next(self.seq), req, self.drafter, self.verifier,
                                            self.max_seq_len, emit, policy=policy,
                                            draft_timeout_s=2.0, ngram=self.ngram(),
                                            in_target=tuple(self.target.drafters),
                                            on_round=on_round)
                finally:
                    self.planner.close(policy)
                reqs.append((time.perf_counter() - t0, stats))
                ttfts.extend(first)

        async def all_streams():
            await asyncio.gather(*(worker() for _ in range(streams)))

        def counts():
            if not hasattr(self.target, "simulated"):   # no table: nothing padded
                return 0, 0, 0, 0, 0.0, 0.0
            t, d = self.target.simulated, self.draft.simulated
            return t.over, t.calls, d.over, d.calls, t.over_s + d.over_s, t.simulated_s
        before = counts()
        t0, cpu0 = time.perf_counter(), time.process_time()
        asyncio.run(all_streams())
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        d = [a - b for a, b in zip(counts(), before)]
        out = {"tokens": sum(s.num_output_tokens for _, s in reqs), "wall_s": wall,
               "request_s": sum(t for t, _ in reqs), "rounds": sum(s.rounds for _, s in reqs),
               "requests": len(reqs), "ttft_s": sum(ttfts) / len(ttfts) if ttfts else None,
               "discarded": discarded[0],
               "draft_s": sum(s.draft_s for _, s in reqs),
               "verify_s": sum(s.verify_s for _, s in reqs),
               "drafted": sum(s.total_draft_tokens for _, s in reqs),
               "accepted": sum(s.total_accepted_draft_tokens for _, s in reqs),
               # calls whose real CPU compute outran the simulated time (not padded at all)
               "calls_over_table": d[0] + d[2], "calls": d[1] + d[3], "over_s": d[4],
               # a target call's device time (the table's, or the CPU's where that was longer)
               "target_execution_s": d[5] / d[1] if d[1] else None,
               "cpu_s": {"in process": cpu}}
        log(f"in process {mode.name} x{streams} {setting.label}: "
            f"{out['tokens'] / wall:.1f} tok/s")
        return out
