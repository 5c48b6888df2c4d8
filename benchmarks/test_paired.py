"""paired.py: the order of each pair's runs, the ratios' summary and the printed table."""
import pytest

from paired import markdown, order, parse_args, summary


def test_the_side_that_runs_first_alternates_pair_to_pair():
    assert [order(p)[0] for p in range(4)] == ["served", "transformers"] * 2
    assert all(sorted(order(p)) == ["served", "transformers"] for p in range(4))


def test_summary_takes_the_median_range_and_pairs_at_the_goal():
    s = summary([1.42, 1.51, 1.33, 1.5, 1.4999], 1.5)
    assert (s["median"], s["min"], s["max"]) == (1.4999, 1.33, 1.51)
    assert (s["met"], s["pairs"]) == (2, 5)   # 1.4999 misses: the count is exact


def test_auto_is_minus_one_and_zero_is_refused():
    assert parse_args(["--k", "-1"]).k == -1
    assert parse_args([]).stream and not parse_args(["--no-stream"]).stream
    for bad in (["--k", "0"], ["--k", "-2"], ["--pairs", "0"], ["--server-env", "X=1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_markdown_prints_each_pair_and_the_summary():
    side = {"served_same_text": 4, "transformers_same_text": 3}
    pairs = [{"pair": 1, "first": "served",
              "target-only": {**side, "served": 90.0, "transformers": 100.0, "ratio": 0.9},
              "speculative": {**side, "served": 150.0, "transformers": 100.0, "ratio": 1.5}}]
    report = {"config": {"k": -1}, "pairs": pairs,
              "summary": {"target-only": summary([0.9], 0.9),
                          "speculative": summary([1.5], 1.5)}}
    out = markdown(report, 4).splitlines()
    assert out[0] == "Served requests: streamed."
    assert "served auto" in out[2]
    assert out[4].startswith("| 1 | served | 90.0 | 100.0 | 0.90x | 150.0 | 100.0 | 1.50x |")
    assert "served 4/4, `generate` 3/4, assisted 3/4" in out[4]
    assert out[-1] == ("- speculative: median 1.500x (range 1.500-1.500), "
                       "1 of 1 pairs at or above 1.5x")
    report["config"]["stream"] = False
    assert markdown(report, 4).splitlines()[0] == "Served requests: one response each."


def test_an_output_unlike_the_targets_fails_the_run():
    from paired import differ
    runs = {"served_same_text": 4, "transformers_same_text": 4}
    report = {"pairs": [{"target-only": dict(runs), "speculative": dict(runs)}]}
    assert not differ(report, 4)
    report["pairs"][0]["speculative"]["transformers_same_text"] = 3
    assert differ(report, 4)
