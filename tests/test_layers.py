"""Layers against independent numpy references (float64 loops), with segment ids."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from idattn.layers import (Dense, HeadNorm, InterdomainMixer, RMSNorm, ShortConv, causal_attention,
                           positions_from_segments, rope, xi)
from idattn.ops import document_index

SEG = np.array([[1, 1, 1, 2, 2, 1, 1, 1, 1], [5, 5, 5, 5, 5, 5, 5, 5, 5]], np.int32)  # row 0: three documents


def np_doc_pos(seg):
    doc = np.zeros_like(seg)
    pos = np.zeros_like(seg)
    for b in range(seg.shape[0]):
        for t in range(1, seg.shape[1]):
            new = seg[b, t] != seg[b, t - 1]
            doc[b, t] = doc[b, t - 1] + new
            pos[b, t] = 0 if new else pos[b, t - 1] + 1
    return doc, pos


def test_document_index_and_positions_restart():
    doc, pos = np_doc_pos(SEG)
    np.testing.assert_array_equal(document_index(jnp.asarray(SEG), 2, 9), doc)
    np.testing.assert_array_equal(positions_from_segments(jnp.asarray(SEG), 2, 9), pos)
    assert list(pos[0]) == [0, 1, 2, 0, 1, 0, 1, 2, 3]  # repeated id 1 is a new document


def np_rope(x, pos, base=10000.0):
    out = np.zeros_like(x)
    d = x.shape[-1]
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            for i in range(d // 2):
                th = pos[b, t] * base ** (-2 * i / d)
                c, s = np.cos(th), np.sin(th)
                out[b, t, :, i] = x[b, t, :, i] * c - x[b, t, :, i + d // 2] * s
                out[b, t, :, i + d // 2] = x[b, t, :, i + d // 2] * c + x[b, t, :, i] * s
    return out


def test_rope_matches_loop_and_is_relative():
    r = np.random.RandomState(0)
    x = r.randn(2, 9, 3, 8)
    _, pos = np_doc_pos(SEG)
    np.testing.assert_allclose(rope(jnp.asarray(x, jnp.float32), jnp.asarray(pos)), np_rope(x, pos), atol=1e-5)
    q, k = r.randn(1, 1, 1, 8), r.randn(1, 1, 1, 8)
    dot = lambda a, b: float(np.sum(np.asarray(rope(jnp.asarray(q, jnp.float32), jnp.full((1, 1), a)))  # noqa
                                    * np.asarray(rope(jnp.asarray(k, jnp.float32), jnp.full((1, 1), b)))))
    assert abs(dot(7, 3) - dot(104, 100)) < 1e-4 and abs(dot(7, 3) - dot(3, 7)) > 1e-3


def test_rmsnorm_and_xi():
    r = np.random.RandomState(1)
    x = r.randn(2, 5, 16).astype(np.float32)
    m = RMSNorm(1e-5)
    p = m.init(jax.random.PRNGKey(0), x)
    p = jax.tree_util.tree_map(lambda a: a * 1.5, nn.meta.unbox(p))
    ref = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, -1, keepdims=True) + 1e-5) * 1.5
    np.testing.assert_allclose(m.apply(p, x), ref, rtol=1e-5)
    s = x / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(xi(jnp.asarray(x)), s / np.sqrt(np.sum(s * s, -1, keepdims=True) + 1e-6), rtol=1e-5)


def np_short_conv(x, w, doc):
    k = w.shape[0]
    y = np.zeros_like(x)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            for j in range(k):
                if t - j >= 0 and doc[b, t - j] == doc[b, t]:
                    y[b, t] += w[k - 1 - j] * x[b, t - j]
    return y


def test_short_conv_respects_documents_and_streams():
    r = np.random.RandomState(2)
    x = r.randn(2, 9, 2, 4).astype(np.float32)
    doc, _ = np_doc_pos(SEG)
    m = ShortConv(2, 4, 4)
    p = nn.meta.unbox(m.init(jax.random.PRNGKey(0), x))
    w = np.asarray(p["params"]["kernel"], np.float64)
    y, _ = m.apply(p, jnp.asarray(x), jnp.asarray(doc))
    np.testing.assert_allclose(y, np_short_conv(x.astype(np.float64), w, doc), atol=1e-5)
    # streaming (decode) path: one document, split 5 + 4 with the K−1 state carried == whole sequence
    one = np.zeros((2, 9), np.int32)
    ref = np_short_conv(x.astype(np.float64), w, one)
    y1, st = m.apply(p, jnp.asarray(x[:, :5]), None, jnp.zeros((2, 3, 2, 4)))
    y2, _ = m.apply(p, jnp.asarray(x[:, 5:]), None, st)
    np.testing.assert_allclose(np.concatenate([y1, y2], 1), ref, atol=1e-5)


def test_flat_head_layout_equals_per_head_references():
    """The mixer's flat [B, T, H·d] forms (idattn/layers/interdomain.py keeps every per-token tensor flat for the
    TPU kernels) against the float64 references per head: RoPE, ξ, N+β, the short convolution (with documents
    and streaming), Dense."""
    r = np.random.RandomState(5)
    B, T, H, d = 2, 9, 3, 8
    x = r.randn(B, T, H, d).astype(np.float32)
    flat = lambda a: jnp.asarray(a).reshape(B, -1, H * d)  # noqa: E731
    doc, pos = np_doc_pos(SEG)
    np.testing.assert_allclose(np.asarray(rope(flat(x), jnp.asarray(pos), num_heads=H)).reshape(B, T, H, d),
                               np_rope(x.astype(np.float64), pos), atol=1e-5)
    s = x / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(np.asarray(xi(flat(x), num_heads=H)).reshape(x.shape),
                               s / np.sqrt(np.sum(s * s, -1, keepdims=True) + 1e-6), rtol=1e-5, atol=1e-7)
    m = HeadNorm(H, d, flat=True)
    p = nn.meta.unbox(m.init(jax.random.PRNGKey(0), flat(x)))
    scale, bias = r.randn(H, d), r.randn(H, d)
    p = {"params": {"scale": jnp.asarray(scale, jnp.float32), "bias": jnp.asarray(bias, jnp.float32)}}
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt(np.mean(x64 ** 2, -1, keepdims=True) + 1e-5) * scale + bias
    np.testing.assert_allclose(np.asarray(m.apply(p, flat(x))).reshape(x.shape), ref, rtol=1e-5, atol=1e-5)
    conv = ShortConv(H, d, 4)
    pc = nn.meta.unbox(conv.init(jax.random.PRNGKey(1), x))
    w = np.asarray(pc["params"]["kernel"], np.float64)
    y, _ = conv.apply(pc, flat(x), jnp.asarray(doc))
    np.testing.assert_allclose(np.asarray(y).reshape(x.shape), np_short_conv(x64, w, doc), atol=1e-5)
    y1, st = conv.apply(pc, flat(x[:, :5]), None, jnp.zeros((B, 3, H, d)))
    y2, st2 = conv.apply(pc, flat(x[:, 5:]), None, st)
    assert st.shape == st2.shape == (B, 3, H, d)  # the decoding cache keeps its per-head shape
    np.testing.assert_allclose(np.concatenate([y1, y2], 1).reshape(x.shape), np_short_conv(x64, w, np.zeros_like(doc)),
                               atol=1e-5)
    dn = Dense((H, d), (5,), ("heads", "kv", "embed"), flat=True)
    pd = nn.meta.unbox(dn.init(jax.random.PRNGKey(2), flat(x)))
    np.testing.assert_allclose(dn.apply(pd, flat(x)),
                               np.einsum("bthd,hdn->btn", x64, np.asarray(pd["params"]["kernel"], np.float64)),
                               rtol=1e-5, atol=1e-5)


def test_softmax_attention_segment_mask():
    r = np.random.RandomState(3)
    q, k, v = (r.randn(2, 9, 2, 4).astype(np.float32) for _ in range(3))
    doc, _ = np_doc_pos(SEG)
    out = np.asarray(causal_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(doc), "xla"))
    ref = np.zeros_like(out, dtype=np.float64)
    for b in range(2):
        for h in range(2):
            for t in range(9):
                js = [j for j in range(t + 1) if doc[b, j] == doc[b, t]]
                s = np.array([q[b, t, h] @ k[b, j, h] / 2.0 for j in js])
                a = np.exp(s - s.max())
                ref[b, t, h] = (a / a.sum()) @ v[b, js, h]
    np.testing.assert_allclose(out, ref, atol=1e-5)
    # the even-length wrapper of cuDNN's masked path (T = 9 is odd): the padded call, cut back, is the same attention
    from idattn.layers.attention import _even_length, _xla_attention
    seen = []
    padded = _even_length(lambda *a: seen.append(a[0].shape[1]) or _xla_attention(*a))
    np.testing.assert_allclose(padded(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(doc)), ref, atol=1e-5)
    assert seen == [10]
    with pytest.raises(ValueError, match="attention impl"):
        causal_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), None, "flash3")


def np_mixer(p, x, seg, inp, readout, use_rope, conj, gate, eps=1e-5, contraction="mean"):
    """The Interdomain layer (docs/model.md, Mixers), written as float64 loops from the module's parameters."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), p)
    x = x.astype(np.float64)
    doc, pos = np_doc_pos(seg)
    bsz, t, _ = x.shape
    dense = lambda n: np.einsum("btd,dhk->bthk", x, p[n]["kernel"])  # noqa: E731
    conv = lambda n, a: np_short_conv(a, p[n]["kernel"], doc)  # noqa: E731

    def ksi(a):
        s = a / (1 + np.exp(-a))
        return s / np.sqrt(np.sum(s * s, -1, keepdims=True) + 1e-6)

    def nb(name, a):
        return a / np.sqrt(np.mean(a * a, -1, keepdims=True) + eps) * p[name]["scale"] + p[name]["bias"]

    if readout == "query":
        q = conv("conv_q", dense("wq"))
        fq = ksi(np_rope(q, pos) if use_rope else q)
    if inp == "dualkv":
        k = conv("conv_k", dense("wk"))
        zk, zv = nb("ssm_norm_k", ksi(np_rope(k, pos) if use_rope else k)), nb("ssm_norm_v", dense("wv"))
    else:
        h1 = conv("conv_1", dense("w1"))
        zk, zv = nb("ssm_norm_k", np_rope(h1, pos) if use_rope else h1), nb("ssm_norm_v", conv("conv_2", dense("w2")))
    a = -np.exp(p["ssm_log_a_re"]) + 1j * p["ssm_a_im"]
    dt = np.exp(p["ssm_log_dt"])[:, None]
    lam = np.exp(dt * a)  # the κ clamp is inactive at this init (Re ΔA ≥ −0.05)
    bb = (lam - 1) / a * (p["ssm_b_re"] + 1j * p["ssm_b_im"])
    c = p["ssm_c_re"] + 1j * p["ssm_c_im"]
    h, m = lam.shape
    o = np.zeros(zv.shape)
    for b in range(bsz):
        for hh in range(h):
            xk = np.zeros((m, zk.shape[-1]), complex)
            xv = np.zeros((m, zv.shape[-1]), complex)
            for s in range(t):
                if s > 0 and doc[b, s] != doc[b, s - 1]:
                    xk[:], xv[:] = 0, 0
                xk = lam[hh][:, None] * xk + np.outer(bb[hh], zk[b, s, hh])
                xv = lam[hh][:, None] * xv + np.outer(bb[hh], zv[b, s, hh])
                u, g = c[hh] @ xk, c[hh] @ xv
                if readout == "query":
                    pq = u @ fq[b, s, hh]
                    o[b, s, hh] = np.real((np.conj(pq) if conj else pq) @ g)
                else:  # linear in the state: the coefficients averaged (or summed) over their mode index, halves added
                    red = np.mean if contraction == "mean" else np.sum
                    o[b, s, hh] = np.real(red(u, 0)) + np.real(red(g, 0))
    if gate:
        o = o / (1 + np.exp(-dense("wg")))
    if readout == "linear":
        o = np.einsum("bthk,hkgj->btgj", o, p["c_out"]["kernel"])
    return np.einsum("bthk,hkd->btd", o, p["wo"]["kernel"])


@pytest.mark.parametrize("inp,readout,use_rope,conj,gate,contraction", [
    ("dualkv", "query", True, True, False, "mean"),
    ("generic", "linear", False, False, True, "mean"),
    ("dualkv", "linear", True, True, False, "mean"),
    ("generic", "linear", True, True, False, "sum"),
])
def test_interdomain_mixer_matches_numpy_loop(inp, readout, use_rope, conj, gate, contraction):
    r = np.random.RandomState(4)
    x = r.randn(2, 9, 16).astype(np.float32)
    # The linear cells run the chunked path (chunk 4 over 9 tokens: a tail chunk, resets inside chunks).
    impl = "sequential" if readout == "query" else ("chunked" if inp == "dualkv" else "sequential")
    m = InterdomainMixer(d_model=16, num_heads=2, head_dim=8, num_modes=4, input=inp, readout=readout,
                         use_rope=use_rope, conj=conj, output_gate=gate, impl=impl, chunk_size=4,
                         linear_contraction=contraction)
    doc, pos = np_doc_pos(SEG)
    args = (jnp.asarray(x), jnp.asarray(doc), jnp.asarray(pos))
    p = nn.meta.unbox(m.init(jax.random.PRNGKey(0), *args, segment_ids=jnp.asarray(SEG)))["params"]
    # move B and C off their inits so that every parameter matters
    p = dict(p)
    for n in ("ssm_b_im", "ssm_c_im", "ssm_c_re", "ssm_norm_k"):
        p[n] = jax.tree_util.tree_map(lambda a: a + 0.3 * jax.random.normal(jax.random.PRNGKey(7), a.shape), p[n])
    y, _ = m.apply({"params": p}, *args, segment_ids=jnp.asarray(SEG))
    ref = np_mixer(p, x, SEG, inp, readout, use_rope, conj, gate, contraction=contraction)
    np.testing.assert_allclose(np.asarray(y), ref, rtol=2e-4, atol=2e-4 * np.max(np.abs(ref)))


def test_mixer_switch_errors():
    m = InterdomainMixer(d_model=16, num_heads=2, head_dim=8, num_modes=4, input="kv")
    x = jnp.zeros((1, 3, 16))
    with pytest.raises(ValueError, match="model.input.*'kv'"):
        m.init(jax.random.PRNGKey(0), x, None, jnp.zeros((1, 3), jnp.int32))
