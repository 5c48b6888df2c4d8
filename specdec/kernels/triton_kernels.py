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


# A query's attention is one fixed chain of arithmetic: its keys cut into splits of SPLIT keys
# from key 0, each split an online softmax over its BN-key blocks from a fresh state, the splits'
# states merged in order. A call runs the chain in one program per query tile (DIRECT) or, where
# that leaves the GPU idle (one row's decode step: a program per KV head), one program per tile
# and split then a merging program per tile: the same operations on the same values either way.
# Splits and blocks past a query's position are exact no-ops: the running max stays, its rescale
# is exp(0) = 1 and the empty state's weight exp(-1e30 - max) = 0, so whatever else the call
# holds changes nothing for a query. The arguments that change with the call's rows and tokens
# are not specialized on (triton compiles a variant per value that is 1 or a multiple of 16).


@triton.jit
def _tile(positions, b, tile, T, G, L, window, spb, spt, BM: tl.constexpr, BN: tl.constexpr):
    """Query j of a tile: token j // G, head kv * G + j % G of row b. Returns j, whether it is a
    query of the call, its token, its position (-1 past the call) and the keys the tile sees:
    from lo (a block edge: under a window, the first block its earliest query sees; the blocks
    before are masked for every query of the tile, so skipping them changes no bit) to end."""
    j = tile * BM + tl.arange(0, BM)
    valid = j < T * G
    t = j // G
    pos = tl.load(positions + b * spb + t * spt, mask=valid, other=-1)       # [BM]
    first = tl.min(tl.where(valid, pos, L), 0)
    lo = tl.where(window > 0, tl.maximum(first - window + 1, 0), 0) // BN * BN
    return j, valid, t, pos, lo, tl.minimum(tl.max(pos, 0) + 1, L)


@triton.jit
def _split(qv, k, v, slot, kvh, pos, start, stop, window, scale, softcap,
           sks, skn, skh, skd, svs, svn, svh, svd, d, dm,
           BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, CAP: tl.constexpr):
    """The online softmax of keys start..stop (a split) from a fresh state: (max, sum, acc)."""
    m_i = tl.full((BM,), -1.0e30, tl.float32)   # finite: a fully masked block rescales by 1
    l_i = tl.full((BM,), 0.0, tl.float32)
    acc = tl.zeros((BM, BD), dtype=tl.float32)
    n = tl.arange(0, BN)
    for n0 in range(start, stop, BN):
        keys = n0 + n
        inside = keys < stop
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
    return m_i, l_i, acc


@triton.jit
def _merge(m, l, acc, ms, ls, accs):
    """The chain's state (m, l, acc) after the next split's (ms, ls, accs)."""
    mn = tl.maximum(m, ms)
    x = tl.exp(m - mn)
    y = tl.exp(ms - mn)
    return mn, l * x + ls * y, acc * x[:, None] + accs * y[:, None]


@triton.jit
def _finish(out, l, acc, b, t, h, d, valid, dm, sob, sot, soh, sod):
    o = acc / tl.where(l > 0, l, 1.0)[:, None]   # 0: a query past T * G, not stored
    tl.store(out + b * sob + t[:, None] * sot + h[:, None] * soh + d[None, :] * sod,
             o.to(out.dtype.element_ty), mask=valid[:, None] & dm[None, :])


@triton.jit(do_not_specialize=["T", "window", "sqb", "sob", "spb", "spr", "sps"])
def attention(q, k, v, out, part_m, part_l, part_acc, slots, positions, T, G, L, window,
              scale, softcap, sqb, sqt, sqh, sqd, sks, skn, skh, skd,
              svs, svn, svh, svd, sob, sot, soh, sod, spb, spt, spr, sps,
              D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
              SPLIT: tl.constexpr, CAP: tl.constexpr, DIRECT: tl.constexpr):
    """out [B, T, H, D]: program (i, kv head, b) attends a tile of BM of row b's T x G queries
    of that KV head over its slot's cached keys (a row's tiles are neighbours in launch order,
    reading the same keys). DIRECT: i is the tile, which runs every split and writes out. Else
    i = split * tiles + tile: the split's state goes to part_* ([B x KV, splits, T x G] rows:
    row strides spr, split strides sps; acc rows of D floats) for attention_merge; a split
    outside the tile's keys writes nothing."""
    b = tl.program_id(2)
    kvh = tl.program_id(1)
    if DIRECT:
        tile = tl.program_id(0)
    else:
        tile = tl.program_id(0) % tl.cdiv(T * G, BM)
    j, valid, t, pos, lo, end = _tile(positions, b, tile, T, G, L, window, spb, spt, BM, BN)
    h = kvh * G + j % G
    d = tl.arange(0, BD)
    dm = d < D
    slot = tl.load(slots + b)
    qv = tl.load(q + b * sqb + t[:, None] * sqt + h[:, None] * sqh + d[None, :] * sqd,
                 mask=valid[:, None] & dm[None, :], other=0.0)                # [BM, BD]
    if DIRECT:
        m = tl.full((BM,), -1.0e30, tl.float32)
        l = tl.full((BM,), 0.0, tl.float32)
        acc = tl.zeros((BM, BD), dtype=tl.float32)
        for s0 in range(lo // SPLIT * SPLIT, end, SPLIT):
            ms, ls, accs = _split(qv, k, v, slot, kvh, pos, tl.maximum(s0, lo),
                                  tl.minimum(s0 + SPLIT, end),
                                  window, scale, softcap, sks, skn, skh, skd, svs, svn, svh,
                                  svd, d, dm, BM, BN, BD, CAP)
            m, l, acc = _merge(m, l, acc, ms, ls, accs)
        _finish(out, l, acc, b, t, h, d, valid, dm, sob, sot, soh, sod)
    else:
        s0 = (tl.program_id(0) // tl.cdiv(T * G, BM)) * SPLIT
        if (s0 < end) & (s0 + SPLIT > lo):
            ms, ls, accs = _split(qv, k, v, slot, kvh, pos, tl.maximum(s0, lo),
                                  tl.minimum(s0 + SPLIT, end),
                                  window, scale, softcap, sks, skn, skh, skd, svs, svn, svh,
                                  svd, d, dm, BM, BN, BD, CAP)
            row = (b * tl.num_programs(1) + kvh) * spr + (s0 // SPLIT) * sps + j
            tl.store(part_m + row, ms, mask=valid)
            tl.store(part_l + row, ls, mask=valid)
            tl.store(part_acc + row[:, None] * D + d[None, :], accs,
                     mask=valid[:, None] & dm[None, :])


@triton.jit(do_not_specialize=["T", "window", "sob", "spb", "spr", "sps"])
def attention_merge(part_m, part_l, part_acc, out, positions, T, G, L, window,
                    sob, sot, soh, sod, spb, spt, spr, sps,
                    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, D: tl.constexpr,
                    SPLIT: tl.constexpr):
    """Program (tile, kv head, b): merges the tile's split states in order into out."""
    b = tl.program_id(2)
    kvh = tl.program_id(1)
    j, valid, t, pos, lo, end = _tile(positions, b, tl.program_id(0), T, G, L, window, spb,
                                      spt, BM, BN)
    h = kvh * G + j % G
    d = tl.arange(0, BD)
    dm = d < D
    m = tl.full((BM,), -1.0e30, tl.float32)
    l = tl.full((BM,), 0.0, tl.float32)
    acc = tl.zeros((BM, BD), dtype=tl.float32)
    base = (b * tl.num_programs(1) + kvh) * spr + j
    for s0 in range(lo // SPLIT * SPLIT, end, SPLIT):
        row = base + (s0 // SPLIT) * sps
        accs = tl.load(part_acc + row[:, None] * D + d[None, :],
                       mask=valid[:, None] & dm[None, :], other=0.0)
        m, l, acc = _merge(m, l, acc, tl.load(part_m + row, mask=valid, other=-1.0e30),
                           tl.load(part_l + row, mask=valid, other=0.0), accs)
    _finish(out, l, acc, b, t, h, d, valid, dm, sob, sot, soh, sod)


# The layer's pointwise work on CUDA (gpu_pointwise.py): one program a row, each row's sums in one
# fixed order, so a row's bits never depend on the other rows or their count. The roundings are
# model.RMSNorm's and MLP's: the residual sum rounded to the activations' dtype, statistics in
# float32, Llama's norm rounded before its weight multiplies it, Gemma's rounded once.
@triton.jit(do_not_specialize=["rows"])
def add_rmsnorm(x, add, w, total, out, rows, D, eps,
                HAS_ADD: tl.constexpr, GEMMA: tl.constexpr, BD: tl.constexpr):
    """Row r of x [rows, D] (contiguous): total = x + add where HAS_ADD, out = RMSNorm(total)."""
    r = tl.program_id(0)
    d = tl.arange(0, BD)
    m = d < D
    s = tl.load(x + r * D + d, mask=m, other=0.0)
    if HAS_ADD:
        s = (s.to(tl.float32) + tl.load(add + r * D + d, mask=m, other=0.0).to(tl.float32)
             ).to(x.dtype.element_ty)
        tl.store(total + r * D + d, s, mask=m)
    h = s.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, 0) / D + eps)
    wv = tl.load(w + d, mask=m, other=0.0).to(tl.float32)
    if GEMMA:
        o = h * (1.0 + wv)
    else:
        o = wv * h.to(x.dtype.element_ty).to(tl.float32)
    tl.store(out + r * D + d, o.to(out.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["rows"])
def silu_mul(gate_up, out, rows, I, BI: tl.constexpr):
    """out [rows, I] = SiLU(gate) x up for gate_up [rows, 2 I] (contiguous, gate first): program
    (r, j) the row's j-th block of BI; SiLU rounded to the dtype before the product, as F.silu."""
    r = tl.program_id(0)
    i = tl.program_id(1) * BI + tl.arange(0, BI)
    m = i < I
    g = tl.load(gate_up + r * 2 * I + i, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gate_up + r * 2 * I + I + i, mask=m, other=0.0).to(tl.float32)
    a = (g / (1.0 + tl.exp(-g))).to(out.dtype.element_ty).to(tl.float32)
    tl.store(out + r * I + i, (a * u).to(out.dtype.element_ty), mask=m)
