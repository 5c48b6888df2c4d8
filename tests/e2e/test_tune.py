"""`specdec tune --url`: the same prompts through the real server, K = 0, each K and auto."""
import json

from specdec.cli import main


def test_tune_measures_the_running_server(server, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("def main():\\n\nclass Queue:\\n\n")
    out = tmp_path / "tune.json"
    assert main(["tune", "--quiet", "--prompts", str(prompts), "--ks", "2", "--max-tokens", "8",
                 "--url", server.grpc, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["measured_on"] == "server"
    rows = {r["k"]: r for r in report["rows"]}
    assert rows[0]["server_speedup"] == 1.0 and rows[2]["server_tokens_per_s"] > 0
    assert rows[2]["server_acceptance"] is not None
    assert report["server_auto"]["tokens_per_s"] > 0
    assert report["best_k"] == max(rows.values(), key=lambda r: r["server_speedup"])["k"]
    assert "server tok/s" in capsys.readouterr().out
