"""The Triton kernels of the exact mode on CUDA (invariant_gemm.py, invariant_attention.py),
in a module of their own: importing it needs triton, which only CUDA runs. Each fixes its
tiling, so a row's (a query's) arithmetic never depends on what else the call holds. The CPU
tests run them in Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported:
tests/conftest.py)."""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["M", "m_tiles"])
def gemm(x, w, out, M, N, K, m_tiles, sxm, sxk, swn, swk, som, son,
         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """out [M, N] = x [M, K] @ w [N, K]^T: program pid computes the [BM, BN] tile (pid % m_tiles,
    pid // m_tiles), summing BK-wide slices of K in order into a float32 accumulator."""
    pid = tl.program_id(0)
    pid_n, pid_m = pid // m_tiles, pid % m_tiles   # an N tile's M tiles are neighbours
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(x + rm[:, None] * sxm + kk[None, :] * sxk,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)   # [BM, BK]
        b = tl.load(w + rn[None, :] * swn + kk[:, None] * swk,
                    mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)   # [BK, BN]
        acc = tl.dot(a, b, acc)
    tl.store(out + rm[:, None] * som + rn[None, :] * son, acc.to(out.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


# Arguments that change with the call's rows and tokens are not specialized on (triton compiles
# a variant per value that is 1 or a multiple of 16): every call runs one compiled kernel.
@triton.jit(do_not_specialize=["T", "window", "sqb", "sob", "spb"])
def attention(q, k, v, out, slots, positions, T, G, L, window, scale, softcap,
              sqb, sqt, sqh, sqd, sks, skn, skh, skd, svs, svn, svh, svd,
              sob, sot, soh, sod, spb, spt,
              D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
              CAP: tl.constexpr):
    """out [B, T, H, D]: program (b, kv head, m) attends BM of row b's T x G queries of that KV
    head (query j: token j // G, head kv * G + j % G) over its slot's cached keys, BN keys at a
    time from key 0 in order, by online softmax in float32. Key blocks past a query's position
    are masked whole: the running max stays, its rescale is exp(0) = 1 and its weights exact
    zeros, so the blocks another query of the call needs change nothing for this one."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    j = tl.program_id(2) * BM + tl.arange(0, BM)
    valid = j < T * G
    t = j // G
    h = kvh * G + j % G
    d = tl.arange(0, BD)
    dm = d < D
    qv = tl.load(q + b * sqb + t[:, None] * sqt + h[:, None] * sqh + d[None, :] * sqd,
                 mask=valid[:, None] & dm[None, :], other=0.0)                # [BM, BD]
    pos = tl.load(positions + b * spb + t * spt, mask=valid, other=-1)       # [BM]
    end = tl.minimum(tl.max(pos, 0) + 1, L)   # the keys this program's queries may see
    slot = tl.load(slots + b)
    m_i = tl.full((BM,), -1.0e30, tl.float32)   # finite: a fully masked block rescales by 1
    l_i = tl.full((BM,), 0.0, tl.float32)
    acc = tl.zeros((BM, BD), dtype=tl.float32)
    n = tl.arange(0, BN)
    for n0 in range(0, end, BN):
        keys = n0 + n
        inside = keys < end
        kb = tl.load(k + slot * sks + keys[None, :] * skn + kvh * skh + d[:, None] * skd,
                     mask=dm[:, None] & inside[None, :], other=0.0)             # [BD, BN]
        s = tl.dot(qv, kb) * scale                                              # [BM, BN]
        if CAP:   # softcap * tanh(s / softcap)
            s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
        see = (keys[None, :] <= pos[:, None]) & inside[None, :]
        see = see & ((window == 0) | (keys[None, :] > pos[:, None] - window))
        s = tl.where(see, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vb = tl.load(v + slot * svs + keys[:, None] * svn + kvh * svh + d[None, :] * svd,
                     mask=inside[:, None] & dm[None, :], other=0.0)             # [BN, BD]
        acc = tl.dot(p.to(vb.dtype), vb, acc * alpha[:, None])
        m_i = m_new
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]   # 0: a query past T * G, not stored
    tl.store(out + b * sob + t[:, None] * sot + h[:, None] * soh + d[None, :] * sod,
             o.to(out.dtype.element_ty), mask=valid[:, None] & dm[None, :])
