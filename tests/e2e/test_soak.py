"""The soak's CI minute (loadtest/soak.py; `make soak` runs it for 10 minutes on a server of its
own): locust at saturation on the session's server, HTTP SSE and gRPC, greedy and sampled, K
auto/4/0, a tenth of the requests cancelled mid-stream; no unexpected failure, no KV slot left
held, no server process restarted, memory flat."""
import importlib.util

import pytest

from loadtest.soak import problems, soak

# A minute cannot tell a slow leak from noise: 10 MiB/min here, the 10-minute soak holds 2. The
# engine's process wanders (soak.ENGINE_PROCESSES): 40-s slopes with no leak ranged -29 to +11
# MiB/min, and 10.4 failed a CI run of 1a7590f; 30 still catches a leak of about 80 KB a
# request at this load's 380 requests a minute.
CI_SLOPE_LIMIT_MIB_PER_MIN = 10.0
CI_ENGINE_SLOPE_LIMIT_MIB_PER_MIN = 30.0


@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="locust is not installed")
def test_soak_minute(server, tmp_path):
    users = 2 * int(server.metric("specdec_kv_slots_total", model="target_model"))
    # Samples every 5 s after 20 s of warm-up: at 10 s after 12 s, four points once read
    # target_model's warm-up as 17 MiB/min (a fresh-clone CI of 0033266).
    r = soak(server.http, server.grpc, server.metrics, server.pid, 60, users, tmp_path,
             interval_s=5.0, max_tokens=32, warm_s=20.0)
    failures = tmp_path / "soak_failures.csv"
    assert r["locust_exit"] == 0, (failures.read_text() if failures.exists() else "",
                                   (tmp_path / "soak_locust.log").read_text()[-12000:])
    assert r["requests"] >= 2 * users and r["cancelled"] > 0, r
    assert len(r["memory"]) == 7 and all(m["samples"] >= 6 for m in r["memory"].values()), r
    assert problems(r, CI_SLOPE_LIMIT_MIB_PER_MIN, CI_ENGINE_SLOPE_LIMIT_MIB_PER_MIN) == [], r
