"""target_model: a thin adapter over specdec.serving.engine_model.TargetModel."""
import json

import triton_python_backend_utils as pb_utils

from specdec.serving.engine_model import TargetModel


class TritonPythonModel:
    def initialize(self, args):
        self.model = TargetModel(pb_utils, json.loads(args["model_config"]))

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        # Tensor-parallel workers (specdec/runtime/tensor_parallel/parallel_engine.py) stop with an
        # unload, not only through the parent-death signal when the stub exits.
        getattr(getattr(self.model, "engine", None), "stop", lambda: None)()
