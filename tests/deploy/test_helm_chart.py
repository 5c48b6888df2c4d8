"""The Helm chart: static checks that need no helm binary, then `helm lint` / `helm template`
when a helm binary is on PATH."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from specdec.openai.limits import Limits
from specdec.launcher import launch, shutdown

from .helpers import CHART, REPO, copy_destination, env_names_read_by_code, openai_args

yaml = pytest.importorskip("yaml")

TEMPLATES = CHART / "templates"
EXAMPLES = sorted((REPO / "deploy" / "helm" / "examples").glob("*.yaml"))
VALUES_REF = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
ACTION = re.compile(r"\{\{-?(.*?)-?\}\}", re.S)
BLOCK_OPENERS = {"if", "with", "range", "define", "block"}
# Values whose keys are free-form Kubernetes objects: example files may add any key below them.
FREE_FORM = {"resources", "podSecurityContext", "securityContext", "autoscaling.behavior"}


def values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def template_files() -> list[Path]:
    files = sorted(p for p in TEMPLATES.iterdir() if p.is_file())
    assert files
    return files


def lookup(tree: dict, dotted: str):
    node = tree
    for key in dotted.strip(".").split("."):
        if not isinstance(node, dict) or key not in node:
            raise KeyError(dotted)
        node = node[key]
    return node


def test_chart_yaml():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == CHART.name
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    project = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert chart["appVersion"] == project.group(1), "appVersion should follow pyproject's version"


def test_values_parse():
    v = values()
    assert isinstance(v, dict)
    for key in ("image", "models", "specdec", "gpu", "shm", "service", "serviceMonitor",
                "autoscaling", "probes"):
        assert key in v, f"values.yaml lacks {key}"
    assert v["serviceMonitor"]["enabled"] is False and v["autoscaling"]["enabled"] is False


def test_every_values_reference_exists():
    v = values()
    refs = {(p.name, m.group(1)) for p in template_files()
            for m in VALUES_REF.finditer(p.read_text())}
    assert len(refs) > 20
    missing = []
    for name, ref in sorted(refs):
        try:
            lookup(v, ref)
        except KeyError:
            missing.append(f"{name}: .Values{ref}")
    assert not missing, "referenced but not in values.yaml: " + ", ".join(missing)


@pytest.mark.parametrize("path", sorted(p.name for p in TEMPLATES.iterdir()))
def test_template_actions_are_balanced(path):
    text = (TEMPLATES / path).read_text()
    assert text.count("{{") == text.count("}}"), "unbalanced {{ }}"
    depth = pos = 0
    while (start := text.find("{{", pos)) != -1:
        end = text.find("}}", start)
        assert end != -1, f"{{{{ at offset {start} never closes"
        assert text.find("{{", start + 2, end) == -1, f"{{{{ nested inside an action at {start}"
        body = text[start + 2:end].strip("-").strip()
        word = body.split()[0] if body.split() else ""
        if word in BLOCK_OPENERS:
            depth += 1
        elif word == "end":
            depth -= 1
            assert depth >= 0, f"{{{{ end }}}} without a block at offset {start}"
        pos = end + 2
    assert depth == 0, f"{depth} block(s) never closed with {{{{ end }}}}"


def test_includes_are_defined():
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    defined = set(re.findall(r'define\s+"([^"]+)"', helpers))
    used = {name for p in template_files()
            for name in re.findall(r'(?:include|template)\s+"([^"]+)"', p.read_text())}
    assert used and used <= defined, f"undefined: {sorted(used - defined)}"


def _keys(tree: dict, prefix=""):
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        yield dotted, value
        if isinstance(value, dict) and dotted not in FREE_FORM:
            yield from _keys(value, dotted + ".")


@pytest.mark.parametrize("example", [p.name for p in EXAMPLES])
def test_example_values_use_only_known_keys(example):
    v = values()
    ex = yaml.safe_load((REPO / "deploy" / "helm" / "examples" / example).read_text())
    unknown = []
    for dotted, _ in _keys(ex):
        parent = dotted.rpartition(".")[0]
        if parent and isinstance(lookup(v, parent), dict) and not lookup(v, parent):
            continue   # an empty {} default (labels, annotations): free-form
        try:
            lookup(v, dotted)
        except KeyError:
            unknown.append(dotted)
    assert not unknown, f"{example}: not in values.yaml (a typo?): {unknown}"


def test_examples_exist():
    assert EXAMPLES, "deploy/helm/examples/ should hold at least the Llama example"


def env_names_read(monkeypatch) -> set[str]:
    """What settings.py's parsers read (helpers' spy), and the launcher's and the gateway's own
    parsers: they go through the same lookup, and the spy stays in place for the rest of the test,
    recording into the set it returned."""
    seen = env_names_read_by_code(monkeypatch)
    shutdown.ShutdownSettings.parse()
    Limits.read()
    assert shutdown.ENV in seen
    return seen


def test_deployment_env_names_are_read_by_the_code(monkeypatch):
    text = "".join((TEMPLATES / f).read_text() for f in ("deployment.yaml", "_helpers.tpl"))
    names = set(re.findall(r"-\s+name:\s+(SPECDEC_[A-Z0-9_]+)", text))
    for needed in ("TARGET_MODEL", "DRAFT_MODEL", "DEFAULT_NUM_DRAFT_TOKENS", "MAX_SEQUENCES",
                   "MAX_SEQ_LEN", "DEFAULT_MAX_TOKENS", "DEFAULT_PROPOSER", "SHUTDOWN_GRACE_S"):
        assert f"SPECDEC_{needed}" in names
    unknown = names - env_names_read(monkeypatch)
    assert not unknown, f"the code never reads {sorted(unknown)}"


def settings_env() -> str:
    text = (TEMPLATES / "_helpers.tpl").read_text()
    start = text.index('{{- define "triton-specdec.settingsEnv" -}}')
    return text[start:text.index("{{- end }}\n{{- end }}", start)]


def test_both_containers_get_the_same_settings():
    """The gateway applies the server's request limits: the same SPECDEC_* variables, from one
    template, in both containers, with Helm values for the default max_tokens and proposer."""
    text = (TEMPLATES / "deployment.yaml").read_text()
    server = text[text.index("        - name: tritonserver\n"):text.index("        - name: openai\n")]
    for block in (server, openai_container_text()):
        assert block.count('{{- include "triton-specdec.settingsEnv" . | nindent 12 }}') == 1
        assert "SPECDEC_" not in block.replace("SPECDEC_*", "")   # all of them from the template
    env = settings_env()
    v = values()["specdec"]
    assert v["defaultMaxTokens"] == 64 and v["defaultProposer"] == ""
    assert re.search(r"- name: SPECDEC_DEFAULT_MAX_TOKENS\n\s+value: \{\{ \.Values\.specdec\."
                     r"defaultMaxTokens \| int64 \| quote \}\}", env)
    assert re.search(r"\{\{- with \.Values\.specdec\.defaultProposer \}\}\n- name: "
                     r"SPECDEC_DEFAULT_PROPOSER\n", env)
    for name in ("TARGET_MODEL", "DRAFT_MODEL", "EAGLE_HEAD", "TOKENIZER", "MAX_TOKENS_LIMIT",
                 "MAX_DRAFT_TOKENS", "SHUTDOWN_GRACE_S"):
        assert f"- name: SPECDEC_{name}\n" in env, name
    assert "{{- with .Values.extraEnv }}" in env


def test_the_shutdown_grace_is_the_pods_less_a_margin():
    """tritonserver's --exit-timeout-secs and the gateway's graceful shutdown come from
    SPECDEC_SHUTDOWN_GRACE_S, which the chart sets from terminationGracePeriodSeconds; the code's
    default is what the chart's default gives."""
    env = settings_env()
    m = re.search(r"- name: SPECDEC_SHUTDOWN_GRACE_S\n\s+value: \{\{ max 0 \(sub \(int "
                  r"\.Values\.terminationGracePeriodSeconds\) (\d+)\) \| quote \}\}", env)
    assert m and int(m.group(1)) == shutdown.MARGIN_S
    period = values()["terminationGracePeriodSeconds"]
    assert shutdown.ShutdownSettings().shutdown_grace_s == period - shutdown.MARGIN_S
    assert "terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}" in \
        (TEMPLATES / "deployment.yaml").read_text()


def test_a_rollout_needs_no_spare_gpu():
    """Kubernetes' default rolling update starts a new pod (a GPU) before stopping an old one."""
    strategy = values()["strategy"]
    assert strategy == {"type": "RollingUpdate",
                        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    text = (TEMPLATES / "deployment.yaml").read_text()
    assert "{{- with .Values.strategy }}\n  strategy:\n    {{- toYaml . | nindent 4 }}" in text
    assert "strategy" in (REPO / "docs" / "deploy.md").read_text()


@pytest.mark.parametrize("example", [p.name for p in EXAMPLES])
def test_examples_leave_k_on_auto(example):
    """docs/tune.md: leave num_draft_tokens on auto; an example is what users copy."""
    ex = yaml.safe_load((REPO / "deploy" / "helm" / "examples" / example).read_text())
    assert ex.get("specdec", {}).get("numDraftTokens", -1) == -1


def test_the_python_models_are_counted_right():
    n = len(list((REPO / "model_repository").glob("*/1/model.py")))
    words = {5: "five", 6: "six", 7: "seven", 8: "eight"}
    for path in (TEMPLATES / "deployment.yaml", REPO / "docs" / "deploy.md"):
        counts = re.findall(r"\b(\w+) Python models\b", path.read_text())
        assert counts and all(c in (str(n), words[n]) for c in counts), (path.name, counts, n)


def test_deployment_essentials():
    text = (TEMPLATES / "deployment.yaml").read_text()
    assert "nvidia.com/gpu: {{ .Values.gpu.count }}" in text
    m = re.search(r"startupProbe:\n\s+httpGet:\n\s+path: (\S+)\n\s+port: http\n", text)
    assert m and m.group(1) == "/v2/health/live", "startupProbe should GET /v2/health/live"
    # Triton's own health endpoints stay 200 with a dead backend process: the models must run.
    for probe, command in (("readinessProbe", '[specdec, probe, --timeout, "3"]'),
                           ("livenessProbe", '[specdec, probe, --all, --timeout, "3"]')):
        m = re.search(rf"{probe}:\n\s+exec:\n\s+command: (.+)\n", text)
        assert m and m.group(1) == command, f"{probe} should run {command}"
    shm = re.search(r"- name: dshm\n\s+emptyDir:\n\s+medium: Memory\n\s+sizeLimit: (.+)\n", text)
    assert shm and ".Values.shm.sizeLimit" in shm.group(1)
    assert re.search(r"- name: dshm\n\s+mountPath: /dev/shm\n", text)
    for name, port in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        assert re.search(rf"- name: {name}\n\s+containerPort: {port}\n", text)
    assert "persistentVolumeClaim:" in text and "hostPath:" in text
    # replicas belong to the HPA when autoscaling is on
    assert re.search(r"if not \.Values\.autoscaling\.enabled \}\}\n\s+replicas:", text)


def test_server_arguments_match_the_image(monkeypatch):
    """Same model repository as the Dockerfile's CMD, same backend config as launch.py. No
    --no-restart: the launcher keeps tritonserver, restarting it inside the container after a
    crash (the Deployment's comments and docs/deploy.md say so)."""
    v = values()
    assert v["server"]["modelRepository"] == copy_destination("model_repository")
    text = (TEMPLATES / "deployment.yaml").read_text()
    assert "- python3\n            - -m\n            - specdec.launcher.launch\n" in text
    assert "--no-restart" not in text
    assert "- --tritonserver=tritonserver\n" in text and "- --address=0.0.0.0\n" in text
    assert "- --model-repository={{ .Values.server.modelRepository }}\n" in text
    monkeypatch.setattr(launch, "pytriton_root", lambda: Path("/x"))
    # The chart's byte sizes are the launcher's defaults; the launcher adds
    # shm-region-prefix-name per start of the server itself.
    wanted = {a.rpartition("=")[0]: int(a.rpartition("=")[2])
              for a in launch.command(Path("/r"), Path("/b"), 8000, 8001, 8002)
              if re.match(r"--backend-config=python,shm-\w+-byte-size=", a)}
    assert wanted == {
        "--backend-config=python,shm-default-byte-size": v["server"]["shmDefaultByteSize"],
        "--backend-config=python,shm-growth-byte-size": v["server"]["shmGrowthByteSize"]}


def server_args() -> list[str]:
    """The tritonserver container's args as the template lists them, `.Values.server.*` left as
    `{name}` for str.format, the extraArgs loop left out."""
    text = (TEMPLATES / "deployment.yaml").read_text()
    block = text[text.index("        - name: tritonserver\n"):text.index("        - name: openai\n")]
    items = re.findall(r"^            - (.+)$", block.split("          args:\n")[1]
                       .split("          env:\n")[0], re.M)
    return [re.sub(r"\{\{ \.Values\.server\.(\w+)(?: \| int64)? \}\}", r"{\1}", a)
            for a in items if "{{ . " not in a]


def test_the_charts_server_values_reach_tritonserver(monkeypatch):
    """server.shm* and server.modelRepository as tritonserver gets them from the launcher: once,
    the chart's value in place of the launcher's default (non-default values, so that the default
    cannot pass for them); --exit-timeout-secs from SPECDEC_SHUTDOWN_GRACE_S."""
    seen = {}

    class Keeper:
        def __init__(self, command, *_, **__):
            seen["command"] = command

        def run(self):
            return 0

    monkeypatch.setattr(launch, "Keeper", Keeper)
    monkeypatch.setenv(shutdown.ENV, "37")
    chosen = {"shmDefaultByteSize": 33554432, "shmGrowthByteSize": 8388608,
              "modelRepository": "/somewhere/repo"}
    argv = [a.format(**chosen) for a in server_args()]
    assert argv[:3] == ["python3", "-m", "specdec.launcher.launch"]
    with pytest.raises(SystemExit):
        launch.main(argv[3:])
    command = seen["command"](0)
    for option, value in (("shm-default-byte-size", 33554432), ("shm-growth-byte-size", 8388608)):
        given = [a for a in command if a.startswith(f"--backend-config=python,{option}=")]
        assert given == [f"--backend-config=python,{option}={value}"], given
    assert [a for a in command if a.startswith("--exit-timeout-secs")] == ["--exit-timeout-secs=37"]
    assert "--model-repository=/somewhere/repo" in command
    assert sum(a.startswith("--backend-config=python,shm-region-prefix-name=") for a in command) == 1


def test_pods_run_non_root_on_a_read_only_root_filesystem():
    v = values()
    pod, container = v["podSecurityContext"], v["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["readOnlyRootFilesystem"] is True
    assert container["allowPrivilegeEscalation"] is False and container["capabilities"] == \
        {"drop": ["ALL"]}
    text = (TEMPLATES / "deployment.yaml").read_text()
    # What is written goes to memory-backed or empty volumes: /dev/shm, /tmp (and $HOME there).
    for name, path in (("dshm", "/dev/shm"), ("tmp", "/tmp")):
        assert re.search(rf"- name: {name}\n\s+mountPath: {path}\n", text)
    assert re.search(r"- name: HOME\n\s+value: /tmp\n", text)


def test_network_policy_is_optional_and_limits_ingress_to_the_serving_ports():
    v = values()["networkPolicy"]
    assert v == {"enabled": False, "clients": [], "metricsFrom": [], "egress": []}
    text = (TEMPLATES / "networkpolicy.yaml").read_text()
    assert text.startswith("{{- if .Values.networkPolicy.enabled }}")
    assert "kind: NetworkPolicy" in text and "policyTypes: [Ingress, Egress]" in text
    assert re.search(r"- ports:\n\s+- port: http\n\s+- port: grpc\n", text)
    assert re.search(r"- ports:\n\s+- port: metrics\n", text)
    assert "include \"triton-specdec.selectorLabels\"" in text


def test_service_ports():
    v = values()["service"]
    assert (v["httpPort"], v["grpcPort"], v["metricsPort"]) == (8000, 8001, 8002)
    text = (TEMPLATES / "service.yaml").read_text()
    for name in ("http", "grpc", "metrics"):
        assert re.search(rf"- name: {name}\n\s+port: \{{\{{ \.Values\.service\.{name}Port \}}\}}\n"
                         rf"\s+targetPort: {name}\n", text), f"service port {name}"


def openai_container_text() -> str:
    """The deployment template's `openai` container, up to the pod's volumes."""
    text = (TEMPLATES / "deployment.yaml").read_text()
    start = text.index("        - name: openai\n")
    return text[start:text.index("      volumes:", start)]


def test_the_openai_gateway_is_a_container_of_its_own():
    """`specdec openai` beside the server in the pod, gated by openai.enabled: it calls the
    server's gRPC port over the pod's loopback, listens on every interface on openai.port, and
    has its own probes (liveness: the process; readiness: the ensemble answers). The server's
    launcher is not asked to start a second one."""
    v = values()["openai"]
    assert v["enabled"] is True and v["port"] == 9000
    text = (TEMPLATES / "deployment.yaml").read_text()
    assert "{{- if .Values.openai.enabled }}\n        # The OpenAI API" in text
    assert not re.search(r"^\s+- --openai-port", text, re.M)
    block = openai_container_text()
    args = re.findall(r"^\s+- (\S+)$", block.split("env:")[0].split("args:")[1], re.M)
    assert args[:2] == ["specdec", "openai"], args
    rendered = [a.replace("{{ .Values.openai.port | int64 }}", str(v["port"])) for a in args[2:]
                if "{{" not in a or "openai.port" in a]
    parsed = openai_args(rendered)
    grpc = re.search(r"- --grpc-port=(\d+)\n", text)
    assert parsed.grpc_url == f"127.0.0.1:{grpc.group(1)}"
    assert parsed.host == "0.0.0.0" and parsed.port == v["port"]
    for probe, path in (("startupProbe", "/health/live"), ("readinessProbe", "/health"),
                        ("livenessProbe", "/health/live")):
        assert re.search(rf"{probe}:\n\s+httpGet:\n\s+path: {path}\n\s+port: openai\n", block), \
            probe
    assert re.search(r"- name: openai\n\s+containerPort: \{\{ \.Values\.openai\.port \}\}\n",
                     block)
    assert "nvidia.com/gpu" not in block
    assert re.search(r"- name: NVIDIA_VISIBLE_DEVICES\n\s+value: void\n", block)
    assert re.search(r"- name: HOME\n\s+value: /tmp\n", block)
    assert re.search(r"- name: openai-tmp\n\s+mountPath: /tmp\n", block)
    service = (TEMPLATES / "service.yaml").read_text()
    assert re.search(r"\{\{- if \.Values\.openai\.enabled \}\}\n\s+- name: openai\n"
                     r"\s+port: \{\{ \.Values\.openai\.port \}\}\n\s+targetPort: openai\n", service)
    policy = (TEMPLATES / "networkpolicy.yaml").read_text()
    assert re.search(r"- port: grpc\n\s+\{\{- if \.Values\.openai\.enabled \}\}\n"
                     r"\s+- port: openai\n", policy)


def test_optional_resources_are_gated():
    sm = (TEMPLATES / "servicemonitor.yaml").read_text()
    assert sm.startswith("{{- if .Values.serviceMonitor.enabled }}")
    assert "kind: ServiceMonitor" in sm and "port: metrics" in sm
    hpa = (TEMPLATES / "hpa.yaml").read_text()
    assert hpa.startswith("{{- if .Values.autoscaling.enabled }}")
    assert "apiVersion: autoscaling/v2" in hpa and "kind: HorizontalPodAutoscaler" in hpa
    assert re.search(r"- type: Pods\n\s+pods:\n\s+metric:\n\s+name: \{\{ \.Values\.autoscaling"
                     r"\.metric\.name \}\}", hpa)
    assert "type: AverageValue" in hpa


def test_hpa_metric_is_one_the_server_exports():
    name = values()["autoscaling"]["metric"]["name"]
    sources = [p.read_text() for d in ("specdec", "model_repository")
               for p in (REPO / d).rglob("*.py")]
    quoted = re.compile(rf"[\"']{re.escape(name)}[\"']")
    assert name.startswith("nv_") or any(quoted.search(s) for s in sources), \
        f"no metric named {name!r} in the code"
    assert name in (REPO / "docs" / "deploy.md").read_text(), "docs/deploy.md: adapter rule for it"


def placement_env() -> str:
    text = (TEMPLATES / "_helpers.tpl").read_text()
    start = text.index('{{- define "triton-specdec.placementEnv" -}}')
    return text[start:]


def test_gpu_count_feeds_the_tensor_parallel_degree():
    """SPECDEC_TENSOR_PARALLEL is specdec.tensorParallel, else gpu.count (at least 1), unless the
    user sets it in extraEnv or names the devices alone; a degree above gpu.count fails."""
    assert '{{- include "triton-specdec.placementEnv" . }}' in settings_env()
    env = placement_env()
    assert "{{- $gpus := int .Values.gpu.count }}" in env
    assert "{{- $degree := int (.Values.specdec.tensorParallel | default (max 1 $gpus)) }}" in env
    assert re.search(r"- name: SPECDEC_TENSOR_PARALLEL\n\s+value: \{\{ \$degree \| quote \}\}",
                     env)
    assert re.search(r"\{\{- if and \(gt \$gpus 0\) \(gt \$degree \$gpus\) \}\}\n\{\{- fail ",
                     env)
    assert '{{- if eq .name "SPECDEC_TENSOR_PARALLEL" }}{{ $userSet = true }}{{ end }}' in env
    assert re.search(r"\{\{- with \.Values\.specdec\.targetDevices \}\}\n- name: "
                     r"SPECDEC_TARGET_DEVICES\n", env)
    # the draft's device: set only when given, else the code's default (the target's first)
    assert re.search(r"\{\{- with \.Values\.specdec\.draftDevice \}\}\n- name: "
                     r"SPECDEC_DRAFT_DEVICE\n", env)
    from specdec.serving.engine_settings import EngineSettings
    v = values()
    assert v["specdec"]["draftDevice"] == "" == EngineSettings().draft_device
    assert v["specdec"]["tensorParallel"] == 0 and v["specdec"]["targetDevices"] == ""
    # the chart's default (gpu.count 1) is the code's default degree
    assert max(1, v["gpu"]["count"]) == EngineSettings().tensor_parallel == 1


def example(name: str) -> dict:
    return yaml.safe_load((REPO / "deploy" / "helm" / "examples" / name).read_text())


def test_the_70b_example_shards_over_four_gpus_and_fits_them():
    """Llama-3.1-70B-Instruct at degree 4 (gpu.count), the 1B draft on the target's first GPU:
    rank 0's weights and KV plus the draft's, at the example's slots, are the why-comment's
    figure and fit an 80 GB GPU with room to spare."""
    import sys
    sys.path.insert(0, str(REPO / "benchmarks"))
    import torch
    import tp_costs

    from specdec.runtime.tensor_parallel import parallel

    ex = example("llama-3.1-70b.yaml")
    s = ex["specdec"]
    assert ex["models"]["target"].endswith("/Meta-Llama-3.1-70B-Instruct")
    assert ex["models"]["draft"].endswith("/Llama-3.2-1B-Instruct")
    degree = s.get("tensorParallel") or ex["gpu"]["count"]
    assert degree == ex["gpu"]["count"] == 4
    full = tp_costs.model_args(tp_costs.argparse.Namespace(
        preset="llama-70b", scale=1.0, vocab_size=None, layers=None))
    for rank in range(degree):
        parallel.layout(full, rank, degree)   # the shapes divide
    draft = tp_costs.model_args(tp_costs.argparse.Namespace(
        preset="llama-1b", scale=1.0, vocab_size=None, layers=None))
    rows, length = s["maxSequences"], s["maxSeqLen"]
    gpu0 = (tp_costs.rank_bytes(full, torch.bfloat16, degree, rows, length)
            + tp_costs.rank_bytes(draft, torch.bfloat16, 1, rows, length))
    said = re.search(r"(\d+) GB in all", (REPO / "deploy" / "helm" / "examples" /
                                          "llama-3.1-70b.yaml").read_text())
    assert said and abs(int(said.group(1)) - gpu0 / 1e9) < 1, (said, gpu0 / 1e9)
    assert gpu0 < 0.9 * 80e9
    assert s["maxTokensLimit"] < s["maxSeqLen"]


def gib(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(Gi|Mi)", quantity).groups()
    return float(number) / (1024 if unit == "Mi" else 1)


def test_the_70b_example_sizes_shm_and_memory_for_four_ranks():
    ex = example("llama-3.1-70b.yaml")
    limit, shm = gib(ex["resources"]["limits"]["memory"]), gib(ex["shm"]["sizeLimit"])
    # /dev/shm counts as pod memory: it must fit beside the ranks' processes
    assert gib(values()["shm"]["sizeLimit"]) < shm < limit / 4
    assert gib(ex["resources"]["requests"]["memory"]) <= limit
    # loading 141 GB may take long: more startup time than the 8B default of 15 minutes
    startup = ex["probes"]["startup"]
    base = values()["probes"]["startup"]
    assert startup["periodSeconds"] * startup["failureThreshold"] > \
        base["periodSeconds"] * base["failureThreshold"]


# --- with a helm binary ------------------------------------------------------------------------

HELM = shutil.which("helm")
needs_helm = pytest.mark.skipif(
    HELM is None, reason="no helm binary on PATH (none installable from PyPI, npm or Debian in "
                         "this environment); install helm 3 to run lint and template")
VARIANTS = {
    "defaults": [],
    "hpa+servicemonitor": ["--set", "autoscaling.enabled=true",
                           "--set", "serviceMonitor.enabled=true"],
    **{f"example:{p.name}": ["-f", str(p)] for p in EXAMPLES},
}


def helm(*args) -> str:
    done = subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@needs_helm
@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lint(variant):
    helm("lint", "--strict", str(CHART), *VARIANTS[variant])


@needs_helm
@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_template(variant, monkeypatch):
    rendered = helm("template", "t", str(CHART), *VARIANTS[variant])
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = {d["kind"]: d for d in docs}
    hpa = variant != "defaults"
    assert {"Deployment", "Service"} <= set(kinds)
    assert ("HorizontalPodAutoscaler" in kinds) == hpa and ("ServiceMonitor" in kinds) == hpa
    deploy = kinds["Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    c, gateway = pod["containers"]
    assert (c["name"], gateway["name"]) == ("tritonserver", "openai")
    assert gateway["args"][:2] == ["specdec", "openai"]
    assert "nvidia.com/gpu" not in gateway.get("resources", {}).get("limits", {})
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/health", "port": "openai"}
    assert c["args"][:3] == ["python3", "-m", "specdec.launcher.launch"]
    assert "--backend-config=python,shm-default-byte-size=16777216" in c["args"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert c["readinessProbe"]["exec"]["command"][:2] == ["specdec", "probe"]
    assert "--all" in c["livenessProbe"]["exec"]["command"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e["value"] for e in c["env"]}
    assert all(isinstance(x, str) and "e+" not in x for x in env.values()), env
    specdec_names = {n for n in env if n.startswith("SPECDEC_")}
    assert env["HOME"] == "/tmp"
    assert specdec_names <= env_names_read(monkeypatch)
    gateway_env = {e["name"]: e["value"] for e in gateway["env"]}
    assert {n: env[n] for n in specdec_names} == \
        {n: gateway_env.get(n) for n in specdec_names}
    assert env["SPECDEC_SHUTDOWN_GRACE_S"] == str(pod["terminationGracePeriodSeconds"] - 5)
    assert deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    ports = {p["name"]: p["port"] for p in kinds["Service"]["spec"]["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002, "openai": 9000}
    if hpa:
        assert "replicas" not in deploy["spec"]
        (metric,) = kinds["HorizontalPodAutoscaler"]["spec"]["metrics"]
        assert metric["type"] == "Pods"
        assert metric["pods"]["metric"]["name"] == values()["autoscaling"]["metric"]["name"]
    gpus = c["resources"]["limits"]["nvidia.com/gpu"]
    assert env["SPECDEC_TENSOR_PARALLEL"] == str(max(1, gpus))
    if variant.startswith("example:"):
        assert env["SPECDEC_TARGET_MODEL"].startswith("/models/")
        assert any(v.get("persistentVolumeClaim") for v in pod["volumes"])
