"""The workloads' construction and the proposer benchmark's settings (part of `make test`)."""
import json

import proposers
import workloads

SOURCE = '''class A:
    def area(self, w, h):
        """Width times height."""
        s = w * h
        return s

    async def run(self):
        await go()
'''


def test_functions_are_dedented_in_line_order():
    found = workloads.functions([("m.py", SOURCE)])
    assert [w for w, _ in found] == ["m.py:2", "m.py:7"]
    assert found[0][1].startswith("def area(self, w, h):\n    \"\"\"Width")
    assert found[0][1].endswith("return s")
    assert found[1][1] == "async def run(self):\n    await go()"


def test_repeat_prompts_begin_the_function_again():
    src = workloads.functions([("m.py", SOURCE)])[0][1]
    again = workloads.repeat_prompt(src, "again")
    half = workloads.repeat_prompt(src, "half")
    assert again == src + "\n\n\ndef area(self, w, h):"
    assert half == src + '\n\n\ndef area(self, w, h):\n    """Width times height."""'


def test_committed_workload_repeats_each_function():
    rows = [json.loads(line) for line in workloads.REPEATING.read_text().splitlines()]
    assert len(rows) == 32 and {r["kind"] for r in rows} == set(workloads.KINDS)
    for r in rows:  # a whole function, then its own first line(s) again
        body, _, start = r["prompt"].partition("\n\n\n")
        assert body.startswith(start) and start.startswith(body.splitlines()[0])


def test_settings_start_with_the_baseline():
    s = proposers.settings([4, 8], ["draft", "ngram", "medusa"])
    assert s[0] == ("target-only", "draft", 0)
    assert [(p, k) for _, p, k in s[1:]] == [(p, k) for p in ("draft", "ngram", "medusa")
                                              for k in (4, 8)]


def test_prose_prompts_are_fixed_length_cuts_of_the_corpus():
    from inputs import DEFAULT_TARGET, load_tokenizer
    tok = load_tokenizer(DEFAULT_TARGET)
    rows = workloads.prose(tok, seed=0, n=8, tokens=50)
    assert len({r["source"] for r in rows}) == 8
    corpus = " ".join(workloads.prose_corpus().read_text().split())
    for r in rows:
        assert 45 <= len(tok(r["prompt"])["input_ids"]) <= 55, r
        assert " ".join(r["prompt"].split()) in corpus   # a cut of the text, as it reads
    assert workloads.prose(tok, seed=0, n=8, tokens=50) == rows   # the seed fixes them
