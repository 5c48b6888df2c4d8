"""first_token.py's timeline from Triton's trace file."""
from first_token import STAGES, timelines


def _request(root: int, t0: int, post_starts: tuple[int, ...]) -> list[dict]:
    """A traced ensemble request read at t0 ns: its children start 1 ms apart, and a
    postprocessing request for each response (post_starts, ns after t0)."""
    stamps = {None: {"GRPC_WAITREAD_END": 0, "GRPC_SEND_START": 9_000_000,
                     "GRPC_SEND_END": 9_500_000},
              "preprocessing": {"QUEUE_START": 100_000, "REQUEST_START": 50_000,
                                "REQUEST_END": 700_000},
              "speculative_decoding": {"REQUEST_START": 750_000, "COMPUTE_END": 1_000_000}}
    entries = [{"id": root, "model_name": "ensemble", "model_version": 1}]
    children = [(m, s) for m, s in stamps.items() if m] + [
        ("postprocessing", {"REQUEST_START": start, "REQUEST_END": start + 600_000})
        for start in post_starts]
    for i, (model, s) in enumerate(children, start=1):
        entries.append({"id": root * 10 + i, "model_name": model, "parent_id": root})
        entries += [{"id": root * 10 + i, "timestamps": [{"name": n, "ns": t0 + ns}]}
                    for n, ns in s.items()]
    entries += [{"id": root, "timestamps": [{"name": n, "ns": t0 + ns}]}
                for n, ns in stamps[None].items()]
    return entries


def test_a_timeline_a_request_in_order_of_arrival_from_its_first_response():
    trace = _request(2, 50_000_000, (8_000_000, 20_000_000)) + _request(1, 10_000_000,
                                                                        (7_000_000,))
    trace.append({"id": 3, "model_name": "ensemble", "model_version": 1})   # never read: skipped
    first, second = timelines(trace)
    assert list(first) == [label for label, _, _ in STAGES]
    assert first["first response at postprocessing"] == 7.0      # request 1 arrived first
    assert second["first response at postprocessing"] == 8.0     # not its second response's 20
    assert second["postprocessing done"] == 8.6
    assert (second["preprocessing queued"], second["gRPC send ended"]) == (0.1, 9.5)
