"""postprocessing: the text that a response's new ids add (whole UTF-8 characters only)."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from specdec import names
from specdec.serving.adapter import error_response, parameters, read_inputs
from specdec.serving.bls import CancelForwarder
from specdec.serving.detokenize import fallback_bytes, piece
from specdec.serving.settings import tokenizer_path
from specdec.serving.tokenizer import decode_ids, in_triton_stub, load_tokenizer


class TritonPythonModel:
    def initialize(self, args):
        path = tokenizer_path(parameters(json.loads(args["model_config"])))
        self.tokenizer = load_tokenizer(path, torch_free=in_triton_stub())
        self.byte_of = fallback_bytes(self.tokenizer.get_vocab())
        self.cancels = CancelForwarder(pb_utils)

    def _decode(self, ids):
        return decode_ids(self.tokenizer, ids)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                i = read_inputs(pb_utils, request, (names.OUTPUT_IDS, names.PREFIX_LENGTH,
                                                    names.IS_FINAL, names.GENERATION_ID))
                final = bool(i[names.IS_FINAL].reshape(-1)[0])
                if names.GENERATION_ID in i:   # cancelled: the client left, end its generation
                    self.cancels.check(request, int(i[names.GENERATION_ID].reshape(-1)[0]),
                                       final)
                text = piece(self._decode, i[names.OUTPUT_IDS].reshape(-1).tolist(),
                             int(i[names.PREFIX_LENGTH].reshape(-1)[0]), final, self.byte_of)
                out = pb_utils.Tensor(names.TEXT_OUTPUT, np.array([text.encode()], object))
                responses.append(pb_utils.InferenceResponse([out]))
            except Exception as exc:
                responses.append(error_response(pb_utils, exc))
        return responses
