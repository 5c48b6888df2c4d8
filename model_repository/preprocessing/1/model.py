"""preprocessing: tokenizes the prompt and the stop words; bad text is this request's error."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from specdec import names
from specdec.serving.adapter import error_response, parameters, read_inputs
from specdec.serving.requests import parse_stop_words, parse_text
from specdec.serving.tokenizer import encode_request, in_triton_stub, load_tokenizer
from specdec.serving.settings import RequestLimits, tokenizer_path


class TritonPythonModel:
    def initialize(self, args):
        params = parameters(json.loads(args["model_config"]))
        self.limits = RequestLimits.parse(params)
        self.tokenizer = load_tokenizer(tokenizer_path(params), torch_free=in_triton_stub())

    def execute(self, requests):
        return [self._one(r) for r in requests]

    def _one(self, request):
        try:
            inputs = read_inputs(pb_utils, request, (names.TEXT_INPUT, names.STOP_WORDS))
            ids, stop_ids, stop_lengths = encode_request(
                self.tokenizer, parse_text(inputs), parse_stop_words(inputs), self.limits)
        except Exception as exc:
            return error_response(pb_utils, exc)
        out = {
            names.INPUT_IDS: np.array(ids, np.int32),
            names.STOP_IDS: np.array(stop_ids, np.int32),
            names.STOP_LENGTHS: np.array(stop_lengths, np.int32),
        }
        return pb_utils.InferenceResponse([pb_utils.Tensor(n, v) for n, v in out.items()])
