"""transformers' own generate in this process, target alone and assisted by the draft, on the
same prompts for the same number of tokens as the server: the baseline users know."""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from figures import Req, latency_summary
from progress import log


def hf_load(path: Path, dtype, device):
    from transformers import AutoModelForCausalLM
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype, local_files_only=True)
    return model.to(device).eval()


class TimingStreamer:
    """A transformers streamer that only timestamps: the first put is the prompt."""

    def __init__(self, sync):
        self.sync = sync
        self.t0 = 0.0
        self.times: list[float] = []
        self.counts: list[int] = []
        self._prompt_seen = False

    def start(self):
        self.t0, self.times, self.counts, self._prompt_seen = time.perf_counter(), [], [], False

    def put(self, value):
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.sync()
        self.times.append(time.perf_counter() - self.t0)
        self.counts.append(int(value.numel()))

    def end(self):
        pass


def hf_run(label: str, model, tokenizer, prompts: list[tuple[int, str]], lengths: dict[int, int],
           device, assistant, warmup: int, sync,
           progress: bool = True) -> tuple[list[Req], list[list[int]]]:
    import torch
    streamer = TimingStreamer(sync)
    eos = tokenizer.eos_token_id
    if eos is None:
        eos = model.generation_config.eos_token_id

    def one(i: int, prompt: str, n: int) -> tuple[Req, list[int]]:
        enc = tokenizer(prompt, return_tensors="pt")
        ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
        kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, temperature=None,
                  top_p=None, top_k=None, pad_token_id=eos, eos_token_id=eos, streamer=streamer)
        if assistant is not None:
            kw["assistant_model"] = assistant
        sync()
        streamer.start()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, **kw)
        sync()
        total = time.perf_counter() - streamer.t0
        new = out[0, ids.shape[1]:].tolist()
        return (Req(i, len(new), total, streamer.times[0] if streamer.times else None,
                    list(streamer.times), list(streamer.counts)), new)

    for j in range(warmup):
        i, p = prompts[j % len(prompts)]
        one(i, p, lengths[i])
    reqs, outs = [], []
    for i, p in prompts:
        r, new = one(i, p, lengths[i])
        reqs.append(r)
        outs.append(new)
        if progress:
            log(f"{label}: {len(reqs)}/{len(prompts)} prompts, {r.tokens / r.total_s:.1f} tok/s")
    return reqs, outs


def hf_rows(target_dir: Path, draft_dir: Path, tok, prompts: list[tuple[int, str]],
            lengths: dict[int, int], k0_texts: dict[int, str], base_tokens_per_s: float, dtype,
            device, warmup: int) -> list[dict]:
    """Single-stream rows of `transformers generate` and `transformers assisted`: each prompt
    gets the token count the server produced for it at K=0 (lengths), and the speedup is over
    the server's target-only tokens/s (base_tokens_per_s)."""
    import torch
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    target = hf_load(target_dir, dtype, device)
    draft = hf_load(draft_dir, dtype, device)
    rows = []
    for label, assistant in (("transformers generate", None),
                             ("transformers assisted", draft)):
        reqs, outs = hf_run(label, target, tok, prompts, lengths, device, assistant,
                            warmup, sync)
        row = {"setting": label, "k": None, "backend": "transformers", **latency_summary(reqs)}
        row["speedup"] = row["tokens_per_s"] / base_tokens_per_s
        row["same_text_as_server_k0"] = sum(
            tok.decode(o, skip_special_tokens=True) == k0_texts[r.prompt_index]
            for r, o in zip(reqs, outs))
        if assistant is not None:
            # What assisted generation used: the draft's generation_config, else the
            # defaults transformers applies (20 tokens, constant schedule, 0.4 threshold).
            g = assistant.generation_config
            row["assistant_settings"] = {
                "num_assistant_tokens": getattr(g, "num_assistant_tokens", None) or 20,
                "num_assistant_tokens_schedule":
                    getattr(g, "num_assistant_tokens_schedule", None) or "constant",
                "assistant_confidence_threshold":
                    getattr(g, "assistant_confidence_threshold", None) or 0.4}
        row["per_request"] = [asdict(r) for r in reqs]
        rows.append(row)
        log(f"{label}: {row['tokens_per_s']:.1f} tok/s")
    return rows
