"""speculative_decoding: the decoupled orchestrator; the target's engine loads here by default
(target_placement auto), else a BLS call a round to target_model; draft_model by BLS."""
import asyncio
import json
from pathlib import Path

import triton_python_backend_utils as pb_utils

from specdec.runtime.config import ModelArgs
from specdec.serving.adapter import parameters
from specdec.serving.bls import BlsDrafter, BlsVerifier
from specdec.serving.checks import check_shared_sizes, read_model_config, say
from specdec.serving.metrics import Metrics
from specdec.serving.orchestrator import Orchestrator
from specdec.serving.settings import OrchestratorSettings, tokenizer_path
from specdec.serving.tokenizer import special_ids

REPOSITORY = Path(__file__).resolve().parents[2]   # <repository>/speculative_decoding/1/model.py


class TritonPythonModel:
    def initialize(self, args):
        params = parameters(json.loads(args["model_config"]))
        settings = OrchestratorSettings.parse(params)
        check_shared_sizes(settings, REPOSITORY)
        say(args["model_name"], settings.start_line())
        target = ModelArgs.from_dir(settings.target_model_path)
        hosted = settings.drafters.target_hosted
        metrics = Metrics(pb_utils, args["model_name"], settings.max_draft_tokens,
                          in_target=settings.in_target, hosted=hosted)
        if hosted:   # target_placement "orchestrator": the target's engine loads here
            from specdec.serving.engine_model import TargetModel
            from specdec.serving.hosted import HostedVerifier
            config = read_model_config(REPOSITORY / "target_model" / "config.pbtxt")
            verifier = HostedVerifier(pb_utils, TargetModel(pb_utils, config, hosted=True),
                                      on_batch=metrics.target_batch,
                                      max_prefill=settings.prefill_budget())
        else:
            verifier = BlsVerifier(pb_utils, on_batch=metrics.target_batch,
                                   max_prefill=settings.prefill_budget())
        grammars = None
        if hosted:   # the grammar's masks go with the verification, in this process
            from specdec.serving.grammar import Grammars

            def grammars():
                return Grammars.load(tokenizer_path(params), target.vocab_size,
                                     target.eos_token_ids)
        self.orchestrator = Orchestrator(pb_utils, settings, target.eos_token_ids,
                                         target.vocab_size, BlsDrafter(pb_utils), verifier,
                                         metrics, special_ids(tokenizer_path(params)), grammars)

    async def execute(self, requests):
        # Decoupled + async: responses go through each request's sender as they are made.
        await asyncio.gather(*(self.orchestrator.handle(r) for r in requests))
        return None
