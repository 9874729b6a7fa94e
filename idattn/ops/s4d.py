"""S4D parameterisation of the shared complex basis: initialisation and ZOH discretisation.

Continuous state matrix per head (diagonal, M complex modes), with complex numbers stored as real pairs:

    A_m = -exp(log_a_re_m) + i * a_im_m              (Re A < 0 for any real parameter: stable by construction)
    Δ_h = exp(log_dt_h),  log Δ ~ U[log dt_min, log dt_max]

Discretisation (zero-order hold) with the decay bound of idattn/ops/interdomain.py's docstring:

    z_m   = max(Re(Δ A_m), -κ) + i * Im(Δ A_m)       (the bound Re(Δ·A) ≥ -κ, κ = 0.25 by default)
    lam_m = exp(z_m)                                  (|lam| ≥ exp(-κ): the fastest mode keeps 78% per step)
    b_m   = (lam_m - 1) / z_m * Δ * B_m               (= (lam - 1)/A · B with the bounded A = z/Δ)

The bound lives here, not in the operator, so that every `impl` sees the same `lam` whatever its chunk size; the
chunked operator needs |lam|^(-L/2) finite, which `max_chunk_size(kappa)` turns into the largest chunk L allowed.

Initialisations of A (M complex modes, N = 2M real state size as in the S4D reference code):
    "inv"        (default) Re A = -1/2, Im A_n = (N/π)(N/(2n+1) - 1), n = 0..M-1 (all frequencies positive)
    "inv_paper"  the paper's formula with M written literally: Im A_n = (M/π)(M/(2n+1) - 1) (half negative)
    "lin"        Re A = -1/2, Im A_n = π n
    "legs"       Re A = -1/2, Im A = the positive eigenvalue imaginary parts of the normal (skew) part of HiPPO-LegS
                 of size N = 2M, as in the S4D paper.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

S4D_INITS = ("inv", "inv_paper", "lin", "legs")
DEFAULT_KAPPA = 0.25


def _legs_normal_imag(num_states: int) -> np.ndarray:
    """Imaginary parts of the eigenvalues of the normal part of HiPPO-LegS (size N), the positive half, sorted."""
    q = np.arange(num_states, dtype=np.float64)
    r = np.sqrt(2 * q + 1)
    # HiPPO-LegS: A_nk = -sqrt(2n+1)sqrt(2k+1) (n > k), -(n+1) (n = k), 0 (n < k). Adding the rank-1 term P Pᵀ with
    # P_n = sqrt(n + 1/2) gives -1/2 I + skew-symmetric S (the normal-plus-low-rank form of S4).
    a = -np.tril(np.outer(r, r), -1) - np.diag(q + 1)
    p = np.sqrt(q + 0.5)
    normal = a + np.outer(p, p)
    skew = normal + 0.5 * np.eye(num_states)
    eig_imag = np.linalg.eigvalsh(-1j * skew)  # eigenvalues of S are i * (real numbers)
    pos = np.sort(eig_imag[eig_imag > 0])
    return pos


def init_s4d_a(num_modes: int, init: str = "inv") -> tuple[np.ndarray, np.ndarray]:
    """Returns (log_a_re [M], a_im [M]) float32 so that A = -exp(log_a_re) + i·a_im follows the named init."""
    if num_modes < 1:
        raise ValueError(f"num_modes must be a positive integer, got {num_modes}")
    m = num_modes
    n_idx = np.arange(m, dtype=np.float64)
    re = np.full((m,), -0.5)
    if init == "inv":
        n_state = 2 * m
        im = (n_state / math.pi) * (n_state / (2 * n_idx + 1) - 1)
    elif init == "inv_paper":
        im = (m / math.pi) * (m / (2 * n_idx + 1) - 1)
    elif init == "lin":
        im = math.pi * n_idx
    elif init == "legs":
        im = _legs_normal_imag(2 * m)
        if im.shape[0] != m:
            raise AssertionError(f"LegS normal part gave {im.shape[0]} positive frequencies, expected {m}")
    else:
        raise ValueError(f"s4d init must be one of {S4D_INITS}, got {init!r}")
    return np.log(-re).astype(np.float32), im.astype(np.float32)


def init_log_dt(key: jax.Array, shape, dt_min: float = 1e-3, dt_max: float = 1e-1) -> jax.Array:
    """log Δ drawn uniformly in [log dt_min, log dt_max] (Δ log-uniform), float32."""
    if not 0 < dt_min <= dt_max:
        raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
    u = jax.random.uniform(key, shape, jnp.float32)
    return math.log(dt_min) + u * (math.log(dt_max) - math.log(dt_min))


def discretize(log_a_re, a_im, log_dt, b_re, b_im, kappa: float = DEFAULT_KAPPA):
    """ZOH discretisation with the decay bound Re(Δ·A) ≥ -κ.

    Args:
      log_a_re, a_im: [H, M] (or [M], broadcast over heads) real.
      log_dt: [H] real (log Δ per head).
      b_re, b_im: [H, M] (or broadcastable) real: the continuous input gain B.
      kappa: decay bound κ > 0.
    Returns:
      (lam, b): complex [H, M] (complex64, or complex128 when the inputs are float64).
    """
    if not kappa > 0:
        raise ValueError(f"kappa (the decay bound Re(Δ·A) ≥ -κ) must be > 0, got {kappa}")
    log_a_re, a_im, log_dt, b_re, b_im = (jnp.asarray(x) for x in (log_a_re, a_im, log_dt, b_re, b_im))
    dt = jnp.exp(log_dt)[..., None]
    z_re = jnp.maximum(-jnp.exp(log_a_re) * dt, -kappa)
    z_im = a_im * dt
    z = jax.lax.complex(z_re, z_im)
    lam = jnp.exp(z)
    b = (lam - 1) / z * dt * jax.lax.complex(b_re, b_im)
    return lam, b


def max_chunk_size(kappa: float = DEFAULT_KAPPA, dtype=jnp.float32) -> int:
    """The largest chunk length L whose power tables stay safely finite for |lam| ≥ exp(-κ).

    The chunked form multiplies lam^(i-μ) by b·lam^(μ-j) with μ = (L-1)/2, so intermediate magnitudes reach
    |lam|^-(L-1) = exp(κ(L-1)) before the product cancels the growth; we keep that below sqrt(max float):
    κ(L-1) ≤ log(finfo.max)/2. For κ = 0.25 in float32 this is L ≤ 178.
    """
    log_max = math.log(float(jnp.finfo(dtype).max))
    return int(math.floor(log_max / (2 * kappa))) + 1


def min_abs_lam(chunk_size: int, dtype=jnp.float32) -> float:
    """The smallest |lam| the chunked path accepts at this chunk size (inverse of `max_chunk_size`)."""
    if chunk_size <= 1:
        return 0.0
    log_max = math.log(float(jnp.finfo(dtype).max))
    return math.exp(-log_max / (2 * (chunk_size - 1)))
