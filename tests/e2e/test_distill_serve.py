"""A draft made by `specdec distill` from the default target (the default draft converted to a
parallel draft, `--method pard`) is served by a real tritonserver through SPECDEC_DRAFT_MODEL:
it loads, the output is the target's own, and the server accepts exactly the draft tokens that
this draft, run in process, gets accepted."""
import torch
from transformers import AutoTokenizer

from specdec.runtime.config import ModelArgs
from specdec.runtime.engine import Engine
from specdec.records import Request
from specdec_client import GenerationParams, generate
from tests.core.conftest import generate as generate_in_process
from tests.core.distill_helpers import DEFAULT_TARGET
from tests.e2e.conftest import heldout_prompts

PROMPTS = heldout_prompts(2)


def test_server_serves_a_distilled_draft(distilled_server, distilled):
    draft = distilled[0]
    assert ModelArgs.from_dir(draft).pard_token is not None
    cpu = torch.device("cpu")
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    target = Engine.load(str(DEFAULT_TARGET), 2, 128, torch.float32, cpu)
    eos = ModelArgs.from_dir(DEFAULT_TARGET).eos_token_ids
    local = generate_in_process(target, Engine.load(str(draft), 2, 128, torch.float32, cpu), [
        Request(tokenizer(p)["input_ids"], 32, 4, eos=eos) for p in PROMPTS])
    for prompt, (tokens, stats, _) in zip(PROMPTS, local):
        spec = generate(distilled_server.http, prompt, GenerationParams(
            max_tokens=32, temperature=0.0, num_draft_tokens=4))
        plain = generate(distilled_server.http, prompt, GenerationParams(
            max_tokens=32, temperature=0.0, num_draft_tokens=0))
        assert spec.text == plain.text == tokenizer.decode(tokens)
        assert spec.total_draft_tokens == stats.total_draft_tokens
        assert spec.total_accepted_draft_tokens == stats.total_accepted_draft_tokens > 0
