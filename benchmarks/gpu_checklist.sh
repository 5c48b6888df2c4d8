#!/usr/bin/env bash
# The GPU checklist (../shared/GPU.md, items 1, 2, 4 and 5) on a lent GPU machine, nothing
# downloaded: its python3 has torch, transformers, safetensors and pytest, and the models are
# random weights at Llama-3.1-8B / Llama-3.2-1B / the published 8B EAGLE-3 head's shapes
# (acceptance means nothing; the costs are real). Figures and logs are packed into
# $OUT/checklist-PART.tgz after every step (else gpu-out/).
#
#   bash benchmarks/gpu_checklist.sh profile   # first: one decode step of the 8B target and
#                                              # the 1B draft by kind of work (GEMM, attention,
#                                              # norm, rotary, KV write, elementwise, casts,
#                                              # sampling), kernels a step, GEMM GB/s; batch 1
#                                              # and 16, plain and exact, each with and
#                                              # without the fused norms and MLP, 512 cached
#                                              # tokens: about 7 min (dry-run: SCALE=0.0625)
#   bash benchmarks/gpu_checklist.sh costs     # items 2, 4 (+ SWIFT, Medusa), 1 at 8B: 8 min
#   bash benchmarks/gpu_checklist.sh exact     # item 1 on the embedded pair, the exact mode's
#                                              # kernels: 1.5 min (H100) before them
#   bash benchmarks/gpu_checklist.sh kernels   # for a short lease (15 minutes of device time
#                                              # in all): the exact mode's kernels at 8B, the
#                                              # step and prefill with and without them,
#                                              # exactness at 8B, their timings: about 8 min
#   bash benchmarks/gpu_checklist.sh distill   # item 5: a head's training at 8B, about 5 minutes
#   bash benchmarks/gpu_checklist.sh tp        # issue 30: tensor parallelism at 70B's shape,
#                                              # degrees 1/2/4 (on a node with 4 GPUs)
#   bash benchmarks/gpu_checklist.sh served    # item 3: in process against a real tritonserver
#                                              # at 8B shapes, both placements: 6-7 min (H200)
#                                              # (PLACEMENTS=auto: the default alone;
#                                              # MAX_TOKENS=256: requests long enough that their
#                                              # staggered starts and ends weigh little at 16
#                                              # streams; COSTS_S=90:
#                                              # costs.py's step at batch 1 and 16 after it, with
#                                              # the exact mode's Triton kernels and without;
#                                              # FIRST_TOKEN_S=120: first_token.py after it, a
#                                              # first token's stages by Triton's trace at 8B)
#
# Each part writes its own models, so each fits one call of the device tool (10 minutes).
# `served` needs .gpu/ from benchmarks/pack_server.sh carried (tritonserver and the client's
# wheels; the machine has no nvidia-pytriton and no index to install it from). With the tree
# that passes the tool's 64 MiB only if the default models' weights (18 MB, unused there) stay
# behind: `git rm --cached -q models/default/*/model.safetensors`, the same paths in
# .git/info/exclude for the call, then `git reset -q models/default` and the lines removed.
# py-spy (PYSPY=1, 1.8 MB) fits beside it; should it not, leave benchmarks/results/ behind
# too: `git rm -r --cached -q benchmarks/results` (ignored already), `git reset -q` after.
set -uo pipefail
part=${1:-costs}
# Results are written to a work folder and packed after every step into one archive under $OUT
# (the device tool brings back at most 8 files, and what a stopped command left there).
dest=${OUT:-gpu-out}
out=${WORK:-/tmp/gpu-checklist}
mkdir -p "$out" "$dest"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
pair=${PAIR:-/tmp/specdec-random-8b}
# Random weights drawn on the GPU where there is one: the CPU took 94-108 s for the 8B pair on
# the H200's machine, most of a served run's budget.
draw=$($py -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")' 2>/dev/null)
scale=${SCALE:-1}    # a dry run on a CPU: SCALE=0.0625
stamp() {
    tar czf "$dest/checklist-$part.tgz" -C "$out" . 2>/dev/null
    echo "[$(date -u +%H:%M:%S)] $*"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu.txt"
git log -1 --format='commit %H %cI' 2>/dev/null | tee -a "$out/gpu.txt"

case $part in
profile)
    # Where a step's milliseconds go before anything is fused: the H200's 8B step took 7.17 ms
    # where its weights read in 3.35-3.7. The served step is timed with CUDA graphs, then
    # profiled eagerly so that each kernel is seen with the piece of the model that ran it.
    stamp "random pair"
    timeout 160 $py benchmarks/make_random_pair.py --out "$pair" --scale "$scale" \
        --device "$draw" 2>&1 | tail -2
    stamp "step profile"
    # -fused: the layers' norms and SiLU x up by gpu_pointwise's Triton kernels, off by default
    # until this measures them (SPECDEC_FUSED_POINTWISE).
    timeout 420 $py benchmarks/step_profile.py --device "$draw" \
        --models "$pair/target,$pair/draft" --batches 1,16 \
        --modes plain,exact,plain-fused,exact-fused --context 512 \
        --json "$out/step-profile.json" 2>&1 | tee "$out/step-profile.md"
    ;;
costs)
    # 2 and 4 first, the figures no CPU can give: the pair, an EAGLE-3 head, SWIFT (14 of 32
    # layers skipped, about the SWIFT paper's ratio) and 4 random Medusa-1 heads at 8B shapes,
    # their costs in process, CUDA graphs on (off was measured on the H200: 2.3x slower). With
    # the invariance on, each batch's head_accepted is the 8B target's end-to-end check.
    stamp "random pair and head"
    timeout 160 $py benchmarks/make_random_pair.py --out "$pair" --scale "$scale" --head \
        --device "$draw" 2>&1 | tail -4
    stamp "costs"
    skip=${SELF_SKIP:-2,4,6,8,10,12,14,16,18,20,22,24,26,28}
    timeout 200 $py benchmarks/costs.py --pair "$pair" --calls "${CALLS:-10}" --warmup 3 \
        --graphs "${GRAPHS:-on}" --self-skip "$skip" --medusa-heads 4 --prefill 512,2048 \
        --json "$out/costs.json" 2>&1 | tee "$out/costs.md"
    # 1. CUDA correctness: the CUDA-only core tests (captured graphs keep greedy output exact for
    #    the draft, the target and the head; bf16 batch invariance, graphs on and off).
    stamp "CUDA core tests"
    timeout 120 $py -m pytest -q -p no:cacheprovider tests/core -k "cuda or captured" 2>&1 \
        | tee "$out/core-tests.log" | tail -6
    #    Exactness end to end at 8B's shapes: random weights make near-ties everywhere.
    stamp "exactness at 8B shapes"
    timeout 90 $py benchmarks/exactness.py --device cuda --target "$pair/target" \
        --draft "$pair/draft" --head "$pair/eagle" --ks 4 --max-tokens 64 --cost-repeats 0 \
        --json "$out/exactness-8b.json" 2>&1 | tee "$out/exactness-8b.md"
    #    Where a round's milliseconds go at 8B / 1B (the draft measured 2.1 ms a token on an
    #    H200 where its weights take 0.6 ms to read): CPU operators and GPU kernels. On the
    #    H100 50 s did not see its table (the profiled pass and its trace outlast the run).
    stamp "profile at 8B shapes"
    timeout 120 $py benchmarks/profile_engine.py --device cuda --target "$pair/target" \
        --draft "$pair/draft" --k 4 --prompts 2 --max-tokens 32 --top 20 \
        > "$out/profile-8b.md" 2>&1
    ;;
exact)
    # 1. Exactness on the embedded pair: the exact mode's Triton kernels compiled and probed at
    #    8B and Gemma 2 shapes (a failure there is a fallback when serving; the log says why),
    #    which operators keep a row's bits whatever else the forward holds, on this GPU, and
    #    what the invariant linear layer and attention cost at 8B's shapes.
    stamp "Triton kernels at real shapes"
    timeout 120 $py -m pytest -q -p no:cacheprovider tests/core/test_invariant_gemm.py \
        tests/core/test_invariant_attention.py -k cuda 2>&1 | tee "$out/kernels.log" | tail -6
    stamp "invariance probe"
    timeout 180 $py benchmarks/invariance_probe.py --device cuda --json "$out/invariance.json" \
        2>&1 | tee "$out/invariance.md"
    #    Speculative greedy output against target-only in bf16 on CUDA, every proposer (the
    #    in-target ones with --in-target; Medusa heads where reports/medusa-short travelled),
    #    invariance off and on, then its cost.
    stamp "exactness in bf16, invariance off and on"
    medusa=(); [ -d reports/medusa-short ] && medusa=(--medusa reports/medusa-short)
    timeout 150 $py benchmarks/exactness.py --device cuda --ks "${KS:-2,4,auto}" --in-target \
        "${medusa[@]}" --cost-repeats 1 --json "$out/exactness.json" 2>&1 | tee "$out/exactness.md"
    #    The first module where a K=2 verification scores a token otherwise than its one-token
    #    step (docs/exactness.md's open case on CUDA).
    stamp "invariance bisect"
    timeout 90 $py benchmarks/invariance_bisect.py --device cuda --k 2 --json "$out/bisect.json" \
        2>&1 | tee "$out/bisect.md"
    ;;
kernels)
    # What changed since the last GPU run, most valuable first, packed after every step: the
    # kernels compiled and probed at 8B and Gemma 2 shapes (GEMM 16-row and wide tiles,
    # attention per tile and split), then at a random 8B / 1B pair the step, verify(K) and a
    # prompt's prefill plain, exact with the kernels and exact without (the H100's exact step
    # was 16.7 ms against 9.3 plain before the kernels), exactness at 8B, and each kernel's
    # ms against cuBLAS and the padded calls (invariance_probe.py).
    stamp "Triton kernels at real shapes"
    timeout 150 $py -m pytest -q -p no:cacheprovider tests/core/test_invariant_gemm.py \
        tests/core/test_invariant_attention.py -k cuda 2>&1 | tee "$out/kernels.log" | tail -6
    stamp "random pair"
    timeout 160 $py benchmarks/make_random_pair.py --out "$pair" --scale "$scale" \
        --device "$draw" 2>&1 | tail -2
    stamp "costs: plain, exact with and without the kernels"
    timeout 200 $py benchmarks/costs.py --pair "$pair" --batches 1,16 --ks 2,4 --graphs on \
        --invariant both --invariant-kernels both --prefill 512,2048 --calls 10 --warmup 3 \
        --json "$out/costs.json" 2>&1 | tee "$out/costs.md"
    stamp "exactness at 8B shapes"
    timeout 90 $py benchmarks/exactness.py --device cuda --target "$pair/target" \
        --draft "$pair/draft" --head none --ks 4 --max-tokens 64 --cost-repeats 0 \
        --json "$out/exactness-8b.json" 2>&1 | tee "$out/exactness-8b.md"
    stamp "kernel timings"
    timeout 150 $py benchmarks/invariance_probe.py --device cuda --json "$out/invariance.json" \
        2>&1 | tee "$out/invariance.md"
    ;;
distill)
    # 5. `specdec distill --method eagle3` at an 8B target: seconds per step and the peak GPU
    #    memory (distill_report.json: training.seconds, peak_gpu_bytes) against docs/distill.md's
    #    estimate. Few steps and prompts: the rate, not a head.
    stamp "random target"
    timeout 200 $py benchmarks/make_random_pair.py --out "$pair" --scale "$scale" \
        --device "$draw" 2>&1 | tail -2
    stamp "distill"
    timeout 330 $py -m specdec.cli distill --method eagle3 --target "$pair/target" \
        --out /tmp/specdec-head-8b --gen-sequences 64 --gen-tokens 64 --steps 12 \
        --checkpoint-every 1000 --eval-prompts 4 --eval-tokens 32 --overwrite \
        2>&1 | tee "$out/distill.log" | tail -12
    cp /tmp/specdec-head-8b/distill_report.json "$out/distill-report.json" 2>/dev/null
    ;;
tp)
    # Issue 30: the target's costs at degrees 1, 2 and 4 (those the GPUs allow; the others are
    # reported as skipped) at Llama-3.1-70B's layer shape, random weights built on the GPUs (no
    # checkpoint written): the one-token step, verify(K) for K + 1 tokens, the collectives' share
    # of each, one all_reduce alone. LAYERS=20 (about 38 GB in bf16) lets degree 1 run on one
    # 80 GB GPU and compare per layer; LAYERS=80 is the whole model, degree 4 and up only.
    stamp "tensor-parallel costs"
    timeout 540 $py benchmarks/tp_costs.py --degrees "${DEGREES:-1,2,4}" --layers "${LAYERS:-20}" \
        --json "$out/tp-costs.json" 2>&1 | tee "$out/tp-costs.md"
    ;;
served)
    # 3. The same requests in process and through a real tritonserver, at 8B / 1B / the 8B head's
    #    shapes with the server's defaults (bf16, CUDA graphs, the exact mode): tok/s of each,
    #    the overhead per round split by call, BLS calls a round. The default placement (the
    #    draft in target_model's process) and the hosted one (the target's engine in
    #    speculative_decoding's), one server at a time beside the in-process engines (an 80 GB
    #    GPU holds two copies of the pair, not three).
    site=${SITE:-/tmp/site}
    mkdir -p "$site"
    tar -C "$site" -xJf .gpu/pytriton-server.tar.xz || exit 1
    stubsite=/tmp/stub-site
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" $(ls .gpu/*.whl | grep -v /numpy-) || exit 1
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$stubsite" .gpu/numpy-*.whl || exit 1
    export PYTHONPATH=$site:$PYTHONPATH   # the installed package first, as a user runs it
    # The stubs' embedded Python did not see PYTHONPATH's packages (H200, 2026-11-26): a .pth
    # in this interpreter's site-packages puts the pack first there too. The stubs alone get
    # numpy<2 (nvidia-pytriton's pin: under numpy 2.5 the 2.51 stub handed models each input
    # as its first byte repeated), and no scipy or scikit-learn, which here need numpy 2
    # (transformers imports them where they are installed).
    purelib=$($py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    $py - "$site" "$stubsite" "$purelib" <<'EOF2'
import pathlib, sys
site, stub, purelib = sys.argv[1:]
in_stub = (f"if open('/proc/self/cmdline', 'rb').read().split(b'\\0')[0].endswith("
           f"b'triton_python_backend_stub'):\n"
           f"    sys.path.insert(0, {stub!r}); sys.modules.update(sklearn=None, scipy=None)\n")
pathlib.Path(purelib, "0-specdec-gpu-site.pth").write_text(
    f"import sys; sys.path.insert(0, {site!r})\nimport sys; exec({in_stub!r})\n")
EOF2
    ver=$($py -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    stub=$site/pytriton/tritonserver/python_backend_stubs/$ver/triton_python_backend_stub
    libdir=$($py -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
    # The stub links libpython$ver.so.1.0: this interpreter's (launch.py puts its LIBDIR on
    # LD_LIBRARY_PATH), else any on the machine.
    if LD_LIBRARY_PATH=$libdir:$site/nvidia_pytriton.libs ldd "$stub" | grep -q "not found"; then
        lib=$(find / -xdev -name "libpython$ver.so.1.0" 2>/dev/null | head -1)
        echo "libpython$ver not in $libdir; found: ${lib:-none}"
        [ -n "$lib" ] && \
            export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
    LD_LIBRARY_PATH=$libdir:$site/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        ldd "$stub" | grep -E "python|not found" | tee "$out/stub-ldd.txt"
    # The cuDNN torch loads with the interpreter's LIBDIR first on LD_LIBRARY_PATH (how launch.py
    # set the stubs' path before 2026-11-27) and without: a system cuDNN there wins over torch's
    # own, and SDPA without cuDNN's attention runs its math kernels.
    ls "$libdir"/libcudnn* 2>/dev/null | head -3 | tee "$out/cudnn.txt"
    for first in "$libdir" ""; do
        LD_LIBRARY_PATH=$first${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} $py -c 'import sys, torch
c = torch.backends.cudnn
print("LD_LIBRARY_PATH first", sys.argv[1] or "(nothing)", "- cuDNN",
      c.version() if c.is_available() else "unavailable")' "$first"
    done 2>&1 | tee -a "$out/cudnn.txt"
    stamp "random pair and head (readable: served text decodes)"
    timeout 170 $py benchmarks/make_random_pair.py --out "$pair" --scale "$scale" --head \
        --readable --device "$draw" 2>&1 | tail -3
    # py-spy where the pack has it (pack_server.sh PYSPY=1): every measured run's Python
    # processes sampled, in process and served (benchmarks/pyspy.py summarizes them)
    spy=()
    if [ -f .gpu/py-spy.xz ]; then
        xz -dc .gpu/py-spy.xz > /tmp/py-spy && chmod +x /tmp/py-spy && \
            spy=(--py-spy /tmp/py-spy --profile-dir "$out/py-spy")
    fi
    stamp "in process and served"
    # Until BUDGET_S into the part (less COSTS_S and FIRST_TOKEN_S for what runs after it);
    # stopped there, it still prints what it measured. Keep BUDGET_S under the call's limit (the
    # device tool cuts a call at the session's budget, and then nothing is packed): the log also
    # goes straight to $OUT.
    costs_s=${COSTS_S:-0}
    first_s=${FIRST_TOKEN_S:-0}
    left=$(( ${BUDGET_S:-540} - costs_s - first_s - SECONDS ))
    timeout -k 30 $left $py benchmarks/simulated.py \
        --table none --target "$pair/target" --draft "$pair/draft" --head "$pair/eagle" \
        --placements "${PLACEMENTS:-auto,target}" "${spy[@]}" \
        --servers-in-turn --streams "${STREAMS:-1,16}" \
        --proposers "${PROPOSERS:-none,draft,eagle}" --modes greedy --prompts "${PROMPTS:-6}" \
        --max-tokens "${MAX_TOKENS:-48}" --warmup 2 --out "$dest/served.json" 2>&1 \
        | tee "$out/served.md" "$dest/served-log.txt"
    [ ${#spy[@]} -gt 0 ] && $py benchmarks/pyspy.py "$out/py-spy" > "$out/py-spy.md" 2>&1
    if [ "$first_s" -gt 0 ]; then
        # What the server adds to a prefill on a GPU host, stage by stage (Triton's trace): a
        # one-token request and a 64-token one's first response, at 8B in the server's defaults.
        stamp "first token"
        timeout -k 10 $(( ${BUDGET_S:-540} - costs_s - SECONDS )) $py benchmarks/first_token.py \
            --target "$pair/target" --draft "$pair/draft" --prompts 16 \
            --out "$out/first-token.json" 2>&1 | tee "$out/first-token.md"
    fi
    if [ "$costs_s" -gt 0 ]; then
        # The in-process loop's step against the engine's own (exact mode, graphs on) at the
        # batch sizes served: is a round's time the step's?
        stamp "costs at batch ${COST_BATCHES:-1,16}"
        timeout -k 10 $(( ${BUDGET_S:-540} - SECONDS )) $py benchmarks/costs.py --pair "$pair" \
            --batches "${COST_BATCHES:-1,16}" --ks 2,4 --graphs on --invariant on --calls 10 \
            --invariant-kernels "${INVARIANT_KERNELS:-both}" --warmup 3 --prefill 512,2048 \
            --json "$out/costs.json" \
            2>&1 | tee "$out/costs.md"
    fi
    for log in /tmp/specdec-bench-*/tritonserver.log; do   # one a server
        [ -f "$log" ] && cp "$log" "$out/tritonserver-$(basename "$(dirname "$log")").log"
    done
    ;;
*)
    echo "usage: $0 costs|exact|kernels|distill|tp|served" >&2
    exit 2
    ;;
esac
stamp "done"
