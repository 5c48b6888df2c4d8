"""draft_model: a thin adapter over specdec.serving.engine_model.DraftModel."""
import json

import triton_python_backend_utils as pb_utils

from specdec.serving.engine_model import DraftModel


class TritonPythonModel:
    def initialize(self, args):
        self.model = DraftModel(pb_utils, json.loads(args["model_config"]))

    def execute(self, requests):
        return self.model.execute(requests)
