"""The exact mode's Triton kernels compiled ahead of time for an H100 (sm_90) and an A100
(sm_80), without a GPU: triton's own compiler and ptxas, as a GPU's first load would run them.
A kernel that does not compile there would be a fallback on every GPU (invariant_gemm.probe);
this finds it on the CPU, and reads from the PTX that the loads are pipelined (cp.async) into
tensor-core products (mma). Run in a process of its own: the tests' Triton interpreter
(conftest.py) replaces the kernels with interpreted ones as triton is imported."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from specdec.kernels import invariant_attention, invariant_gemm  # noqa: E402

SCRIPT = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specdec.kernels import triton_kernels as tk

UNIT = ("sxk", "swk", "son", "sqd", "skd", "svd", "sod", "spt")
BY_16 = ("N", "K", "sxm", "swn", "som", "L", "sks", "skn", "skh", "svs", "svn", "svh", "sqt",
         "sqh", "sot", "soh")

def compiled(fn, sig, consts, cc, **options):
    # As the JIT specializes a call at an 8B model's shapes: unit strides are constants, the
    # pointers 16-byte aligned and these sizes and strides multiples of 16 (so the loads
    # vectorize and the loop pipelines through shared memory); the arguments the kernels keep
    # unspecialized (M, T, ...) stay plain.
    consts = {**consts, **{n: 1 for n in UNIT if n in sig}}
    sig = {**sig, **{name: "constexpr" for name in consts}}
    aligned = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
               if t.startswith("*") or n in BY_16}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=aligned),
                            target=GPUTarget("cuda", cc, 32), options=options)
    ptx = kernel.asm["ptx"]
    return {"shared": kernel.metadata.shared, "cubin": len(kernel.asm.get("cubin", b"")),
            "cp.async": ptx.count("cp.async"), "mma": ptx.count("mma.sync"),
            "wgmma": ptx.count("wgmma.mma_async"),
            "instructions": sorted({line.split()[0] for line in ptx.splitlines()
                                    if "mma.sync" in line or "wgmma.mma_async" in line})}

gemm, attention, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), {}
ints = lambda names, kind: {n: kind for n in names.split()}
for cc in (80, 90):
    for tiles in ("", " wide"):
        bm, bn, warps, stages = (gemm["wide"] if tiles else
                                 (gemm["BM"], gemm["BN"], gemm["warps"], gemm["stages"]))
        out[f"gemm {cc}{tiles}"] = compiled(
            tk.gemm, {"x": "*bf16", "w": "*bf16", "out": "*bf16",
                      **ints("M N K m_tiles sxm sxk swn swk som son", "i32")},
            {"BM": bm, "BN": bn, "BK": gemm["BK"]}, cc, num_warps=warps, num_stages=stages)
    parts = {n: "*fp32" for n in ("part_m", "part_l", "part_acc")}
    strides = ints("sob sot soh sod spb spt spr sps", "i64")
    # Llama's head dim in both forms; Gemma 2's, capped; the split form's merge
    for d, cap, direct in ((128, False, True), (128, False, False), (256, True, True)):
        out[f"attention {cc} {d}{'' if direct else ' split'}"] = compiled(
            tk.attention, {**{n: "*bf16" for n in ("q", "k", "v", "out")}, **parts,
                           "slots": "*i64", "positions": "*i64",
                           **ints("T G L window", "i32"), "scale": "fp32", "softcap": "fp32",
                           **ints("sqb sqt sqh sqd sks skn skh skd svs svn svh svd", "i64"),
                           **strides},
            {"D": d, "BM": attention["BM"], "BN": attention["BN"], "BD": d,
             "SPLIT": attention["SPLIT"], "CAP": cap, "DIRECT": direct}, cc,
            num_warps=attention["warps"], num_stages=attention["stages"])
    out[f"merge {cc}"] = compiled(
        tk.attention_merge, {**parts, "out": "*bf16", "positions": "*i64",
                             **ints("T G L window", "i32"), **strides},
        {"BM": attention["BM"], "BN": attention["BN"], "BD": 128, "D": 128,
         "SPLIT": attention["SPLIT"]}, cc,
        num_warps=attention["warps"])
print(json.dumps(out))
"""


def test_kernels_compile_for_h100_and_a100(tmp_path):
    g, a = invariant_gemm, invariant_attention
    gemm = dict(BM=g.BLOCK_M, BN=g.BLOCK_N, BK=g.BLOCK_K, warps=g.NUM_WARPS, stages=g.NUM_STAGES,
                wide=(g.WIDE_M, g.WIDE_N, g.WIDE_WARPS, g.WIDE_STAGES))
    attention = dict(BM=a.BLOCK_M, BN=a.BLOCK_N, SPLIT=a.SPLIT, warps=a.NUM_WARPS,
                     stages=a.NUM_STAGES)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(gemm), json.dumps(attention)],
                          env={**env, "TRITON_CACHE_DIR": str(tmp_path)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    kernels = json.loads(done.stdout.splitlines()[-1])
    assert len(kernels) == 12
    for name, k in kernels.items():
        # cubin within the 99 KB of shared memory a block may use on sm_86/89 GPUs; the
        # products on tensor cores, their loads pipelined through shared memory (the merge
        # has no product: it reads each split's state once)
        assert k["cubin"] > 0 and 0 <= k["shared"] <= 99 * 1024, (name, k)
        if not name.startswith("merge"):
            assert k["mma"] + k["wgmma"] > 0 and k["cp.async"] > 0 and k["shared"] > 0, (name, k)
    # The GEMM's wide tiles run the tensor-core instruction its 16-row tiles do, on Hopper too
    # (not wgmma): a row's products round alike whichever tiles a call takes
    for cc in (80, 90):
        narrow, wide = kernels[f"gemm {cc}"], kernels[f"gemm {cc} wide"]
        assert narrow["instructions"] == wide["instructions"] == \
            ["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"], (narrow, wide)
