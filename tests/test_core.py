"""The recurrence's core named explicitly (`core="lti" | "selective"`, idattn.ops.interdomain.resolve_core) and
the chunked forms' one walk over the sequence (`chunked_scan`): a ragged last chunk at its true length on both
cores, so the selective form with a constant lam is the LTI form, output and returned state, at every chunk size
(float64, against the sequential path)."""
import jax
import numpy as np
import pytest

from idattn.ops import interdomain_mix, s4d_linear_mix
from idattn.ops.interdomain import CORES, chunk_decay, resolve_core


# compile time dominates on CPU: most XLA optimisations off for this module (conftest.fast_compile)
pytestmark = pytest.mark.usefixtures("fast_compile")


def _inputs(rng, bsz=1, t=11, h=2, r=3, d=2, m=3):
    lam = 0.9 * np.exp(1j * rng.uniform(-np.pi, np.pi, (h, m)))  # one magnitude per head: a valid selective lam
    b = rng.normal(size=(h, m)) + 1j * rng.normal(size=(h, m))
    fq, zk = rng.normal(size=(bsz, t, h, r)), rng.normal(size=(bsz, t, h, r))
    zv = rng.normal(size=(bsz, t, h, d))
    seg = np.array([[0] * 6 + [1] * (t - 6)] * bsz)
    return fq, zk, zv, lam, b, seg


def test_resolve_core_names_the_core_once():
    lam, lam_t = np.ones((2, 3), complex), np.ones((1, 4, 2, 3), complex)
    assert CORES == ("lti", "selective")
    assert resolve_core(lam, lam) == "lti" and resolve_core(lam_t, lam) == "selective"
    assert resolve_core(lam, lam, "selective") == "selective"  # a constant lam through the per-token form
    with pytest.raises(ValueError, match="core='lti' takes lam, b \\[H, M\\].*lam is per token.*core='selective'"):
        resolve_core(lam_t, lam, "lti")
    with pytest.raises(ValueError, match="core must be one of"):
        resolve_core(lam, lam, "mamba")


@pytest.mark.parametrize("chunk", [4, 16])
def test_both_cores_walk_the_same_chunks(chunk):
    """T = 11: two full chunks and a ragged last one (chunk 4), or one chunk shorter than L (16); a reset inside
    the sequence. core='selective' with the constant lam, b is the LTI function, and both match the
    sequential reference, output and returned state."""
    fq, zk, zv, lam, b, seg = _inputs(np.random.default_rng(chunk))
    with jax.enable_x64(True):
        kw = dict(chunk_size=chunk, segment_ids=seg, return_state=True)
        ref, ref_st = interdomain_mix(fq, zk, zv, lam, b, impl="sequential", segment_ids=seg, return_state=True)
        for core in CORES:
            o, st = interdomain_mix(fq, zk, zv, lam, b, impl="chunked", core=core, **kw)
            np.testing.assert_allclose(o, ref, rtol=1e-10, atol=1e-10)
            for a, e in zip(st, ref_st):
                np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-10)
        z = np.concatenate([zk, zv], axis=-1)
        c = np.ones((lam.shape[0], lam.shape[1]), complex) / lam.shape[1]
        y_ref, x_ref = s4d_linear_mix(z, lam, b, c, impl="sequential", segment_ids=seg, return_state=True)
        for core in CORES:
            y, x = s4d_linear_mix(z, lam, b, c, impl="chunked", core=core, **kw)
            np.testing.assert_allclose(y, y_ref, rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(x, x_ref, rtol=1e-10, atol=1e-10)


def test_chunk_decay_is_the_cumulated_log_decay_of_one_chunk():
    rng = np.random.default_rng(0)
    g, ph = -rng.uniform(0, 1, (2, 5, 3)), rng.uniform(-np.pi, np.pi, (2, 5, 3, 4))  # [B, l, H], [B, l, H, M]
    with jax.enable_x64(True):
        cd = chunk_decay(g, ph, axis=1)
        lc, phc = np.cumsum(g, axis=1), np.cumsum(ph, axis=1)
        np.testing.assert_allclose(cd.cum, lc, rtol=1e-14)
        np.testing.assert_allclose(cd.cos + 1j * cd.sin, np.exp(1j * phc), rtol=1e-13)
        np.testing.assert_allclose(cd.into, np.exp(lc), rtol=1e-13)
        np.testing.assert_allclose(cd.to_end, np.exp(lc[:, -1:] - lc), rtol=1e-13)
        np.testing.assert_allclose(cd.whole, np.exp(lc[:, -1]), rtol=1e-13)
