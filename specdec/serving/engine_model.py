"""draft_model and target_model: a batch of Triton requests -> one batched Engine call.

A request holds one sequence's call, a release, or (target_model) a round's verifications, a
row each (calls.py). A bad call gets its own error, a request's or a row's; the rest of the
batch runs.

torch, and what imports it, is imported where an engine loads or a call runs, not here: by the
placements' defaults target_model and draft_model load nothing (the engines run in
speculative_decoding's process), and importing torch there cost each server start about 3.5 s
to ready on 2 vCPUs (7.4-9.4 s against 4.3-5.1 with the two idle; docs/benchmarks.md).
"""
from __future__ import annotations

import os

import numpy as np

from .. import names
from ..records import Proposer
from ..runtime.config import ModelArgs
from . import calls
from .adapter import error_response, parameters, read_inputs, triton_error
from .checks import check_one_instance, cpu_line, cuda_line, graphs_line, say
from .engine_settings import EngineSettings, check_device
from .requests import InvalidInput
from .settings import InTargetSettings
from .tokenizer import check_draft_tokenizer, in_triton_stub

_COMMON = (names.CALL, names.SAMPLING, names.TOKENS)


class _EngineModel:
    role = ""
    inputs: tuple[str, ...] = _COMMON

    def __init__(self, pb, model_config: dict, hosted: bool = False):
        """hosted: this is target_model's engine loaded in speculative_decoding's process
        (target_placement "orchestrator", serving/hosted.py); target_model itself then loads
        nothing."""
        self.pb = pb
        params = parameters(model_config)
        s = EngineSettings.parse(params, self.role)
        self.settings = s
        it = InTargetSettings.parse(params)
        # A draft placed in target_model's process: checked here too, loaded there.
        colocated = self.role == "draft" and it.draft_in_target and not s.disabled
        elsewhere = self.role == "target" and it.target_hosted and not hosted
        # Why this model loads nothing and refuses every call (None: it serves).
        self.disabled_why = (
            "its draft runs in target_model ($SPECDEC_DRAFT_PLACEMENT)" if colocated else
            "its engine runs in speculative_decoding ($SPECDEC_TARGET_PLACEMENT)" if elsewhere
            else "$SPECDEC_DRAFT_MODEL=none" if s.disabled else None)
        check_one_instance(model_config, f"{self.role}_model")
        # Tests only, none by default (hooks/, imported only then); the hosting process runs
        # this model's script, not the process that loads nothing (the script runs in the
        # first process that claims it).
        self.faults = None
        if s.fault and not elsewhere:
            from ..hooks import faults
            self.faults = faults.Injector(faults.first_process(faults.parse(s.fault),
                                                               f"{self.role}_model"))
        self.shown: list[list] = []   # [slot pool, its used gauge, the count it shows]
        self.engine = None
        if elsewhere:   # the hosting process shows this model's slots
            return
        self._slot_gauges(pb, 0 if self.disabled_why else s.max_sequences)
        if colocated:
            self.check_pair(s, ModelArgs.from_dir(s.target_model_path).vocab_size)
        if self.disabled_why:   # nothing to load, nothing will call it
            return
        import torch

        from ..kernels.cpu import build as cpu_build
        from ..proposers.eagle.checkpoint import HeadCheckpoint
        from ..runtime.engine import Engine
        from .drafters import attach
        if s.torch_device().type == "cpu":
            torch.set_num_threads(s.threads())
            cpu_build.set_threads(s.kernel_thread_count())
        vocab = ModelArgs.from_dir(s.target_model_path).vocab_size
        self.check_pair(s, vocab)
        devices = s.rank_devices() if self.role == "target" else [s.torch_device()]
        device = devices[0]
        if len(devices) == 1:   # above degree 1, parallel_launch.check refuses missing devices
            check_device(device, s.device_source(self.role))
        if device.type == "cuda":
            say(f"{self.role}_model", cuda_line(device))
        dtype = s.torch_dtype()
        head = HeadCheckpoint(s.eagle_head_path) if s.eagle_head_path else None
        # CUDA graphs around NCCL collectives are untested: degree 1 only for now.
        options = dict(vocab_size=vocab, attention_kind=s.attention,
                       cuda_graphs=s.cuda_graphs and device.type == "cuda" and len(devices) == 1,
                       batch_invariant=s.invariant(self.role, dtype),
                       cpu_kernel=s.cpu_kernel if device.type == "cpu" else False,
                       fused_pointwise=s.fused_pointwise)
        if len(devices) > 1:   # this process is rank 0 and starts the others (parallel_launch)
            from ..runtime.tensor_parallel.parallel_launch import start
            self.engine = start(s.model_path, devices, dict(
                max_sequences=s.max_sequences, max_len=s.max_seq_len, **options), dtype,
                threads=s.threads(), head=head)
        else:
            self.engine = Engine.load(s.model_path, s.max_sequences, s.max_seq_len, dtype,
                                      device, head=head, **options)
            if device.type == "cpu":
                say(f"{self.role}_model", cpu_line(self.engine))
            if self.engine.graphs is not None:
                self.engine.capture_graphs()
                say(f"{self.role}_model", graphs_line(self.engine))
        if self.role == "target":
            for line in attach(self.engine, s, it, params, device, dtype):
                say(f"{self.role}_model", line)
        self._show_slots()
        if s.in_target_fault:   # tests only: a drafter fails in a verification that stands
            # Per model: draft_model reads the same setting and loads first.
            from ..hooks import faults
            drafter_faults = faults.Injector(faults.first_process(
                faults.parse(s.in_target_fault), f"{self.role}_model.in_target"))
            faults.fail_drafters(self.engine, lambda: drafter_faults.before(1)[0])
        # Benchmarks only: calls padded to a device's cost table (hooks/simulate.py's ENV),
        # said loudly.
        if os.environ.get("SPECDEC_SIMULATE"):
            from ..hooks import simulate
            self.engine = simulate.from_env(self.engine, self.role)

    def check_pair(self, s: EngineSettings, target_vocab: int) -> None:
        """Refuse a draft or head made for another target, before any weights load."""
        if self.role == "draft":
            own = ModelArgs.from_dir(s.model_path).vocab_size
            # A draft_model that loads nothing (its draft runs in target_model) never needs
            # torch: its stub checks the tokenizers without it.
            idle = self.disabled_why is not None and in_triton_stub()
            say(f"{self.role}_model", check_draft_tokenizer(s.model_path, s.tokenizer_path, own,
                                                            target_vocab, torch_free=idle))
        elif s.eagle_head_path:
            from ..proposers.eagle.checkpoint import check_verifier
            say(f"{self.role}_model", check_verifier(s.eagle_head_path, s.target_model_path))

    def _slot_gauges(self, pb, total: int) -> None:
        # Triton requires a MetricFamily to outlive its metrics: keep both on the instance.
        self.slots_family = pb.MetricFamily(
            name="specdec_kv_slots_used", description="KV cache slots holding a sequence",
            kind=pb.MetricFamily.GAUGE)
        self.slots_total_family = pb.MetricFamily(
            name="specdec_kv_slots_total", description="KV cache slots (max_sequences)",
            kind=pb.MetricFamily.GAUGE)
        self.slots_total = self.slots_total_family.Metric(labels={"model": f"{self.role}_model"})
        self.slots_total.set(total)
        self.slots_used = self.slots_family.Metric(labels={"model": f"{self.role}_model"})
        self.slots_used.set(0)   # a restarted model takes over its dead predecessor's series

    def _show_slots(self) -> None:
        """The target's pool, and a draft model's placed in this process (drafters.py): that
        one as draft_model's, where placement="target" tells it from draft_model's own."""
        self.shown.append([self.engine.pool, self.slots_used, 0])
        draft = self.engine.drafters.get(Proposer.DRAFT)
        if draft is not None:
            labels = {"model": "draft_model", "placement": "target"}
            self.draft_total = self.slots_total_family.Metric(labels=labels)
            self.draft_total.set(draft.engine.pool.num_slots)
            used = self.slots_family.Metric(labels=labels)
            used.set(0)
            self.shown.append([draft.engine.pool, used, 0])

    def execute(self, requests) -> list:
        if self.disabled_why:
            # The caller's mistake, not a failure of this model: refused, not logged as one.
            refusal = InvalidInput(f"{self.role}_model is disabled: {self.disabled_why}")
            return [error_response(self.pb, refusal) for _ in requests]
        try:
            return self._execute(requests)
        finally:
            self.show_slots()

    def show_slots(self) -> None:
        # Only on change: a metric update is a round trip to the server process, and one
        # that a kill -9 interrupts takes tritonserver down with it (docs/reliability.md).
        for shown in self.shown:
            pool, gauge, count = shown
            if pool.active != count:
                shown[2] = pool.active
                gauge.set(pool.active)

    def run_calls(self, work: list) -> list:
        """work's results in order: a call's error in its place (the fault injector's, tests
        only, or the engine's)."""
        results: list = self.faults.before(len(work)) if self.faults else [None] * len(work)
        todo = [i for i, error in enumerate(results) if error is None]
        for i, result in zip(todo, self.run([work[i] for i in todo]) if todo else []):
            results[i] = result
        return results

    def _execute(self, requests) -> list:
        pb = self.pb
        responses: list = [None] * len(requests)
        rows: list[list] = [[] for _ in requests]   # a request's calls, then their results
        work, where = [], []
        for i, request in enumerate(requests):
            try:
                inputs = read_inputs(pb, request, self.inputs)
                if calls.is_release(inputs):
                    self.engine.release([calls.sequence_id(inputs)])
                    responses[i] = pb.InferenceResponse(output_tensors=[])
                    continue
                rows[i] = self.parse(inputs, request)
            except Exception as exc:
                responses[i] = error_response(pb, exc)
                continue
            for j, call in enumerate(rows[i]):
                if not isinstance(call, Exception):
                    work.append(call)
                    where.append((i, j))
        for (i, j), result in zip(where, self.run_calls(work) if work else []):
            rows[i][j] = result
        for i, request in enumerate(requests):
            if responses[i] is None:
                responses[i] = self.respond(rows[i], request)
        return responses


class DraftModel(_EngineModel):
    role = "draft"
    inputs = _COMMON

    def parse(self, inputs, request):
        return [calls.propose_call(inputs)]

    def run(self, work):
        return self.engine.propose(work)

    def respond(self, results: list, request):
        [p] = results
        if isinstance(p, Exception):
            return error_response(self.pb, p)
        out = [self.pb.Tensor(names.DRAFT_TOKENS, np.array([p.tokens], np.int32))]
        if p.probs is not None and names.DRAFT_PROBS in request.requested_output_names():
            from .dlpack import torch_output
            out.append(torch_output(self.pb, names.DRAFT_PROBS, p.probs[None].float()))
        return self.pb.InferenceResponse(output_tensors=out)


class TargetModel(_EngineModel):
    role = "target"
    inputs = _COMMON

    def parse(self, inputs, request):
        from .dlpack import read_torch
        return calls.verify_calls(inputs, read_torch(self.pb, request, names.DRAFT_PROBS))

    def run(self, work):
        return self.engine.verify(work)

    def respond(self, results: list, request):
        """A row per call: a failed call fails its own row, never the request's other rows,
        whose sequences have moved on."""
        rows = []
        for r in results:
            if isinstance(r, Exception):
                error = triton_error(self.pb, r)
                r = (error.message(), error.code() == self.pb.TritonError.UNAVAILABLE)
            rows.append(r)
        return self.pb.InferenceResponse(
            output_tensors=[self.pb.Tensor(names.VERDICT, calls.verdict_output(rows))])
