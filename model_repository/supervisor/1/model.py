"""supervisor: pings draft_model and target_model, restarts one whose process died."""
import json
from functools import partial

import numpy as np
import triton_python_backend_utils as pb_utils

from specdec import names
from specdec.serving import recovery
from specdec.serving.adapter import parameters
from specdec.serving.bls import ping
from specdec.serving.settings import SupervisorSettings

WATCHED = [names.DRAFT_MODEL, names.TARGET_MODEL]


class TritonPythonModel:
    def initialize(self, args):
        settings = SupervisorSettings.parse(parameters(json.loads(args["model_config"])))
        # Triton requires a MetricFamily to outlive its metrics: keep both.
        self.family = pb_utils.MetricFamily(
            name="specdec_model_restarts_total",
            description="Restarts of a model whose backend process died",
            kind=pb_utils.MetricFamily.COUNTER)
        self.restarts = {m: self.family.Metric(labels={"model": m}) for m in WATCHED}
        self.supervisor = recovery.Supervisor(
            WATCHED, partial(ping, pb_utils), partial(recovery.reload, pb_utils),
            settings.health_interval_s, lambda model, s: self.restarts[model].increment(1))
        self.supervisor.start()

    def execute(self, requests):
        status = json.dumps(self.supervisor.state).encode()
        out = pb_utils.Tensor(names.STATUS, np.array([status], object))
        return [pb_utils.InferenceResponse([out]) for _ in requests]

    def finalize(self):
        self.supervisor.stop()
