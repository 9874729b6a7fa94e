"""Static model of the TPU (Mosaic) kernels: grid steps, tokens per step, VMEM, HBM bytes, FLOPs and the
roofline time they imply on v5p / v6e, beside splash attention's - for today's kernels (``idattn/ops/pallas/
tpu.py``, whose ``kernel_cost`` is also what every ``pallas_call``'s ``pl.CostEstimate`` carries) and for the
first kernels (`before`: grid (B, H, T/L), one chunk of one head per step, inputs and modes
transposed in HBM around every call, features padded to 128).

    python -m idattn.bench tpu                      # benchmark shape (16, 128, 32), T = 1K..16K, 65,536 tokens
    python -m idattn.bench tpu --shapes 32,64,64 --seqs 4096 --tokens 8192    # the 1.3B layer, 2 rows per chip

Roofline per kernel: max(MXU time, HBM time) + grid steps × STEP_US (Pallas TPU's per-step overhead, split over
the two TensorCores of a v5p megacore chip). MXU time counts each matmul with k and n rounded up to the MXU width
(128 on v5p, 256 on v6e): the [L, M] = [128, 32] products fill a quarter of a 128-wide MXU whatever the grid.
Splash attention: causal FLOPs 2·B·H·T²·d forward (3.5x that forward + backward) at SPLASH_EFF of peak. Only
jax-free arithmetic here: it runs anywhere, no device needed; a TPU owner compares it with ``bench op``.
"""
from __future__ import annotations

import argparse
import dataclasses

from idattn.ops.pallas import tpu as K

STEP_US = 0.35      # Pallas TPU: fixed cost per grid step (docs: "~0.35 us per grid step")
SPLASH_EFF = 0.5    # fraction of MXU peak splash attention reaches (forward and backward)


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    tflops: float    # bf16 peak per chip
    hbm_gbs: float   # HBM bandwidth per chip
    mxu: int         # MXU width
    cores: int       # TensorCores sharing one chip's grid ("parallel" axes split over them)


CHIPS = {"v5p": Chip("v5p", 459.0, 2765.0, 128, 2), "v6e": Chip("v6e", 918.0, 1640.0, 256, 1)}

# forward: the two readouts; backward (recompute, save_states=False): per half scan_fwd, scan_rev, bwd
FWD = ("fwd_p", "fwd_o")
BWD = ("scan_fwd", "scan_rev", "bwd_o", "scan_fwd", "scan_rev", "bwd_p")


def _pad(n, k):
    return -(-int(n) // k) * k


def after(kernel, B, T, H, dh, M, L, io_bytes=2, seg=True, has_k=False):
    """Today's kernels: tpu.geometry / tpu.kernel_cost at op.py's padding (features to 8, modes to 8), p / dp in
    the compute dtype, the mode mixing inside fwd_o / scan_rev / bwd_o (``has_k``: with a mixing matrix c)."""
    N, mp, tp = _pad(dh, K.FEATURE_GRANULE), _pad(M, 8), _pad(T, L)
    g = K.geometry(kernel, B, tp, H, N, mp, L, io_bytes=io_bytes, sdt_bytes=io_bytes, seg=seg)
    c = K.kernel_cost(kernel, g, io_bytes=io_bytes, sdt_bytes=io_bytes, seg=seg, mode_bytes=io_bytes, has_k=has_k)
    c["mxu_flops"] = {w: B * H * g.NC * K.chunk_flops(kernel, L, mp, N, mxu=w, has_k=has_k) for w in (128, 256)}
    c["xla_bytes"] = 0   # no transpose, pad or mixing pass around the calls
    return c


def before(kernel, B, T, H, dh, M, L, io_bytes=2, seg=True, has_k=False):
    """The first TPU kernels: grid (B, H, NC); features padded to 128 in HBM (op.py), [B,T,H,N] <-> [B,H,T,N] and
    [B,T,H,2,M] <-> [B,H,2,T,M] transposed in HBM around the call (each a read and a write); per-step blocks
    (L, N) and (2, L, M), VMEM double-buffered."""
    N, mp, tp = _pad(dh, 128), _pad(M, 8), _pad(T, L)
    NC = tp // L
    feat = B * tp * H * N * io_bytes
    modes = B * tp * H * 2 * mp * 4
    cstate = B * H * NC * 2 * mp * N * io_bytes
    state = B * H * 2 * mp * N * 4
    tabs = B * H * 2 * (L * mp + 4 * mp) * 4
    segb = B * H * (tp * 4 * 3 + NC * (L * 4 + 4)) if seg else 0
    acc = B * H * 6 * mp * 4
    nf, nm, nfo, nmo, body = {
        # feature inputs transposed, mode inputs transposed, feature outputs, mode outputs transposed back
        "fwd_p": (2, 0, 0, 1, 2 * feat + modes + 2 * state),
        "fwd_o": (1, 1, 1, 0, modes + 2 * feat + 2 * state),
        "scan_fwd": (1, 0, 0, 0, feat + state + cstate),
        "scan_rev": (1, 1, 0, 0, feat + modes + 2 * state + cstate),
        "bwd_o": (2, 1, 1, 1, 2 * modes + 3 * feat + 2 * cstate + acc),
        "bwd_p": (2, 1, 2, 0, 2 * feat + modes + 2 * cstate + 2 * feat + acc),
    }[kernel]
    # each transpose reads and writes the array; the padding to 128 (d_h < 128) is one more read + write of
    # the unpadded inputs (op.py's jnp.pad; fused with the transpose at best - counted once, in the transpose)
    xla = 2 * (nf + nfo) * feat + 2 * (nm + nmo) * modes
    # the XLA mixing between the halves (float32 planes): forward reads p, writes w; backward reads dw, writes dp
    xla += {"fwd_p": 2 * modes, "bwd_o": 2 * modes}.get(kernel, 0)
    steps = B * H * NC

    def vm(rows, cols, isz):
        return _pad(rows, 8) * _pad(cols, 128) * isz

    blk = {"fwd_p": 2 * vm(L, N, io_bytes) + vm(2 * L, mp, 4), "fwd_o": vm(2 * L, mp, 4) + 2 * vm(L, N, io_bytes),
           "scan_fwd": vm(L, N, io_bytes) + 2 * vm(mp, N, io_bytes),
           "scan_rev": vm(L, N, io_bytes) + vm(2 * L, mp, 4) + 2 * vm(mp, N, io_bytes),
           "bwd_o": 2 * vm(2 * L, mp, 4) + 3 * vm(L, N, io_bytes) + 4 * vm(mp, N, io_bytes),
           "bwd_p": vm(2 * L, mp, 4) + 4 * vm(L, N, io_bytes) + 4 * vm(mp, N, io_bytes)}[kernel]
    return dict(kernel=kernel, grid=(B, H, NC), steps=steps, tokens_per_step=L, heads_per_step=1,
                vmem=2 * blk, bytes=body + tabs + segb, xla_bytes=xla,
                flops=B * H * NC * K.chunk_flops(kernel, L, mp, N),
                mxu_flops={w: B * H * NC * K.chunk_flops(kernel, L, mp, N, mxu=w) for w in (128, 256)})


def roofline_ms(c, chip: Chip):
    """(kernel ms, XLA transposes ms): max(MXU, HBM) + steps × STEP_US / cores; transposes at HBM speed."""
    mxu = c["mxu_flops"][chip.mxu] / (chip.tflops * 1e12)
    hbm = c["bytes"] / (chip.hbm_gbs * 1e9)
    steps = c["steps"] * STEP_US * 1e-6 / chip.cores
    return 1e3 * (max(mxu, hbm) + steps), 1e3 * c["xla_bytes"] / (chip.hbm_gbs * 1e9)


def splash_ms(B, T, H, dh, chip: Chip, mode="fwdbwd"):
    fwd = 2.0 * B * H * T * T * dh  # causal: half of 4·B·H·T²·d
    f = fwd * (3.5 if mode == "fwdbwd" else 1.0)
    return 1e3 * f / (chip.tflops * 1e12 * SPLASH_EFF)


def totals(model, B, T, H, dh, M, L, chip: Chip, kernels=FWD + BWD, io_bytes=2, seg=True):
    steps = byts = xla = 0
    ms = 0.0
    for k in kernels:
        c = model(k, B, T, H, dh, M, L, io_bytes, seg)
        a, b = roofline_ms(c, chip)
        steps, byts, xla, ms = steps + c["steps"], byts + c["bytes"], xla + c["xla_bytes"], ms + a + b
    return dict(steps=steps, bytes=byts, xla_bytes=xla, ms=ms)


def per_kernel_table(B, T, H, dh, M, L, io_bytes=2, seg=True):
    head = (f"{'kernel':>9} {'grid':>16} {'steps':>7} {'tok/step':>8} {'heads':>5} {'VMEM MiB':>8} {'HBM MiB':>8} "
            f"{'GFLOP':>7} {'v5p ms':>7} {'v6e ms':>7}")
    out = [f"per kernel (today), B={B} T={T} (H, d_h, M)=({H}, {dh}, {M}) L={L}, bf16, segment ids", head]
    for k in K.KERNELS:
        c = after(k, B, T, H, dh, M, L, io_bytes, seg)
        v5, v6 = (roofline_ms(c, CHIPS[n])[0] for n in ("v5p", "v6e"))
        out.append(f"{k:>9} {str(c['grid']):>16} {c['steps']:>7} {c['tokens_per_step']:>8} {c['heads_per_step']:>5} "
                   f"{c['vmem'] / 2**20:>8.1f} {c['bytes'] / 2**20:>8.0f} {c['flops'] / 1e9:>7.1f} {v5:>7.3f} {v6:>7.3f}")
    return out


def compare_table(cases, L=128, io_bytes=2, seg=True):
    head = (f"{'(H,d_h,M)':>12} {'T':>6} {'B':>4} {'':>6} {'steps':>8} {'HBM MiB':>8} {'XLA MiB':>8} "
            f"{'v5p ms':>7} {'v6e ms':>7} {'splash v5p':>10} {'splash v6e':>10}")
    out = [head]
    for (H, dh, M), T, B in cases:
        for name, model in (("before", before), ("after", after)):
            r5 = totals(model, B, T, H, dh, M, L, CHIPS["v5p"], io_bytes=io_bytes, seg=seg)
            r6 = totals(model, B, T, H, dh, M, L, CHIPS["v6e"], io_bytes=io_bytes, seg=seg)
            s5 = splash_ms(B, T, H, dh, CHIPS["v5p"]) if name == "after" else None
            s6 = splash_ms(B, T, H, dh, CHIPS["v6e"]) if name == "after" else None
            out.append(f"{str((H, dh, M)):>12} {T:>6} {B:>4} {name:>6} {r5['steps']:>8} {r5['bytes'] / 2**20:>8.0f} "
                       f"{r5['xla_bytes'] / 2**20:>8.0f} {r5['ms']:>7.2f} {r6['ms']:>7.2f} "
                       f"{'' if s5 is None else f'{s5:.2f}':>10} {'' if s6 is None else f'{s6:.2f}':>10}")
    out.append("fwd+bwd of the operator (8 kernels: fwd_p, fwd_o; per half scan_fwd, scan_rev, bwd), bf16, segment ids;"
               " ms = roofline incl. the XLA passes around the calls; XLA MiB = their HBM traffic (before: the transposes"
               " and the float32 mixing between the halves; after: none, the mixing is inside the O-half kernels)")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m idattn.bench tpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="16,128,32", help="H,d_h,M separated by ';' (default: %(default)s)")
    p.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    p.add_argument("--tokens", type=int, default=65536, help="tokens per batch (B = tokens // T)")
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--no-segments", action="store_true")
    p.add_argument("--per-kernel", default="4096", help="contexts T that get the per-kernel table")
    a = p.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split(",")) for s in a.shapes.split(";") if s]
    seqs = [int(x) for x in a.seqs.split(",") if x]
    seg = not a.no_segments
    cases = [(s, T, max(1, a.tokens // T)) for s in shapes for T in seqs]
    lines = compare_table(cases, L=a.chunk, seg=seg)
    for s in shapes:
        for T in [int(x) for x in a.per_kernel.split(",") if x]:
            lines += [""] + per_kernel_table(max(1, a.tokens // T), T, *s, a.chunk, seg=seg)
    print("\n".join(lines))
    return lines
