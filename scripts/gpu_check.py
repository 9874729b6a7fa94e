"""The one prepared device script of the GPU kernel issue: one run, about 6 minutes, on a bare GPU image.

    PYTHONPATH=. python scripts/gpu_check.py --budget-s 330          # on the lent H200 (see docs/kernels.md)
    PYTHONPATH=. python scripts/gpu_check.py --dry-run               # CPU: every code path at tiny shapes

Needs only jax + numpy for (a) and (b); (c) and (d) import the models and the trainer's pieces (MODEL_DEPS). On an
image without some of them, `--deps DIR` (default build/gpu_deps when present) is appended to sys.path (the
image's own packages win): a folder made on a CPU host with `python scripts/gpu_check.py --make-deps
build/gpu_deps` (the pure-Python packages copied from the installed environment, plus the wheels of the compiled
ones the image lacks, DEVICE_WHEELS, fetched for the image's Python and unpacked; 28 MiB) and carried to the
device with carry=["build/gpu_deps"]. Missing packages skip (c) / (d) with the reason; they never stop (a) / (b).

(0) a compile probe of the Triton tuning at the benchmark tiles (fwd+bwd, bf16): the device compiler's
    shared-memory limit decides; the first candidate that compiles everywhere is kept. (float32 is checked by
    the deviceless tests, tests/test_aot_gpu.py; its ptxas time would eat this budget.)
(a) correctness: the Pallas kernels on the GPU against float64 references computed on the CPU backend (a numpy
    loop for outputs and final states, a float64 lax.scan for the gradients of every input), fp32 <= 1e-4 and
    bf16 <= 2e-2: segment resets, carried initial state, c, conj both ways, R = D = 96, T not a multiple of the
    chunk. Prints max relative errors and PASS/FAIL. Its long row, pallas vs the XLA chunked path at T = 65,536
    (~140 s on an H200), runs last, when that much budget is left (`--skip long` drops it).
(b) the operator table of `python -m idattn.bench op` at (H, d_h, M) = (16, 128, 32) and (32, 64, 64),
    T = 1K..16K, 65,536 tokens per batch, fwd and fwd+bwd, against cuDNN causal attention in the same run; beside
    it the cost model's prediction per row (`python -m idattn.bench gpu`, fitted on the 2026-12-04 rows);
(b1) the 2026-12-04 form of the kernels (op.GPU_PRESCALED_SCAN / _MODES and GPU_FUSED_FACTORS off, the
    chunk-parallel forward from 8K, the scans at 8 warps) beside the current one at (16, 128, 32), 4K and 16K,
    fwd and fwd+bwd, in the same process;
(b2) every Pallas launch of a fwd+bwd timed alone (idattn.bench.per_kernel) at (16, 128, 32) 4K and 16K and
    (32, 64, 64) 4K, beside the whole program: the split the cost model needs; then at 16K the four scans again
    with the plan of before 2026-12-07 (gpu.SCAN_TARGET_PROGRAMS 256: two [32, 32] programs per SM, against one
    [32, 64] program per SM now), which decides that default.
(b3) the Mosaic GPU scan probe (idattn.bench.mosaic_scan: the forward's carry scan, LTI, at (32, 64, 64) T = 4K)
    against float64 and timed, beside (b2)'s Triton scan_fwd_k: the same instructions per chunk compiled and the
    same programs per SM, TMA; whether Mosaic GPU's scheduling beats Triton's at equal issue.
(c) `python -m idattn.bench.smoke` (cuDNN attention with segment masks, the model-level Pallas path).
(d) `python -m idattn.bench model`: 125M softmax vs interdomain at 4K and 16K (training tok/s, MFU) and decode
    tok/s at batch 1 and 8 against context.
(e) while the budget lasts: pallas variants (save_states=False: the backward recomputes the chunk states, the
    GPU default saves them; chunk 128; from op.GPU_PARALLEL_FWD_MIN_T the serial forward against the default
    chunk-parallel one), the XLA chunked path, the decode step.
Sections have deadlines inside --budget-s (the table first); every case catches and prints its own error;
progress is flushed as it goes and mirrored to $OUT/gpu_check.log when $OUT is set; a SUMMARY closes the run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# (c) and (d) run as child processes on the same GPU: no process may grab 75% of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

# the float64 references the tests judge every implementation against (NumPy and jax only, nothing of idattn)
from tests.op_reference import document_resets, ref_loop, ref_scan64  # noqa: E402

T0 = time.time()
SUMMARY = []
_LOGFILE = None


def log(*a):
    line = " ".join(str(x) for x in a)
    print(f"[{time.time() - T0:6.1f}s]", line, flush=True)
    if _LOGFILE is not None:
        _LOGFILE.write(f"[{time.time() - T0:6.1f}s] {line}\n")
        _LOGFILE.flush()


# ----------------------------------------------------------------------------------------------------------------
# float64 checks (CPU)


def x64():
    """float64 context across jax versions (jax.enable_x64 / jax.experimental.enable_x64)."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64
    return enable_x64()


def rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def make_case(rng, B, T, H, R, D, M, with_c, with_x0, with_seg, L=64):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    cplx = lambda *s, sc=1.0: (sc * (rng.standard_normal(s) + 1j * rng.standard_normal(s))).astype(np.complex64)  # noqa: E731
    mag = np.exp(-rng.uniform(1e-6, 0.25, (H, M)))
    mag[0, 0], mag[-1, -1] = 1 - 1e-6, np.exp(-0.25)
    lam = (mag * np.exp(1j * rng.uniform(-np.pi, np.pi, (H, M)))).astype(np.complex64)
    b = cplx(H, M, sc=0.3)
    c = cplx(H, M, M, sc=0.4) if with_c else None
    x0 = (cplx(B, H, M, R, sc=0.3), cplx(B, H, M, D, sc=0.3)) if with_x0 else None
    seg = None
    if with_seg:
        seg = np.zeros((B, T), np.int32)
        seg[:, T // 5:] = 1
        seg[:, T // 2:] = 2
        seg[:, (3 * T) // 4:] = 1        # ids repeat: a fourth document
        seg[:, 2 * L if T > 2 * L + 2 else L] = 7  # a one-token document at a chunk start
    return f(B, T, H, R), f(B, T, H, R), f(B, T, H, D), lam, b, c, x0, seg


def check_case(name, dtype, conj, B, T, H, R, D, M, L, with_c, with_x0, with_seg, tol, seed=0):
    from idattn.ops.pallas import interdomain_mix_pallas
    rng = np.random.default_rng(seed)
    fq, zk, zv, lam, b, c, x0, seg = make_case(rng, B, T, H, R, D, M, with_c, with_x0, with_seg, L)
    gpu = jax.devices()[0]
    cpu = jax.devices("cpu")[0]
    fq_d, zk_d, zv_d = (jax.device_put(jnp.asarray(x).astype(dtype), gpu) for x in (fq, zk, zv))
    fq64, zk64, zv64 = (np.asarray(x.astype(jnp.float32), np.float64) for x in (fq_d, zk_d, zv_d))
    go = rng.standard_normal((B, T, H, D)).astype(np.float32)
    gk = (rng.standard_normal((B, H, M, R)) + 1j * rng.standard_normal((B, H, M, R))).astype(np.complex64)
    gv = (rng.standard_normal((B, H, M, D)) + 1j * rng.standard_normal((B, H, M, D))).astype(np.complex64)
    x0k = np.zeros((B, H, M, R), np.complex64) if x0 is None else x0[0]
    x0v = np.zeros((B, H, M, D), np.complex64) if x0 is None else x0[1]
    seg_j = None if seg is None else jnp.asarray(seg)

    def f(fq, zk, zv, lam, b, c, a, v):
        o, (xk, xv) = interdomain_mix_pallas(fq, zk, zv, lam, b, c, conj=conj, chunk_size=L, segment_ids=seg_j,
                                             initial_state=(a, v), return_state=True, out_dtype=jnp.float32)
        return o, xk, xv

    @jax.jit
    def run(*args):
        out, vjp = jax.vjp(f, *args)
        return out, vjp((jnp.asarray(go), jnp.asarray(gk), jnp.asarray(gv)))

    t = time.time()
    (o, xk, xv), grads = run(fq_d, zk_d, zv_d, jnp.asarray(lam), jnp.asarray(b),
                             None if c is None else jnp.asarray(c), jnp.asarray(x0k), jnp.asarray(x0v))
    jax.block_until_ready(grads)
    t_gpu = time.time() - t
    x0_64 = None if x0 is None else (np.asarray(x0k, np.complex128), np.asarray(x0v, np.complex128))
    o_ref, (xk_ref, xv_ref) = ref_loop(fq64, zk64, zv64, lam.astype(complex), b.astype(complex),
                                       None if c is None else c.astype(complex), conj, seg, x0_64)
    resets = document_resets(seg, B, T)
    with x64(), jax.default_device(cpu):
        a64 = (jnp.asarray(fq64), jnp.asarray(zk64), jnp.asarray(zv64), jnp.asarray(lam, jnp.complex128),
               jnp.asarray(b, jnp.complex128), None if c is None else jnp.asarray(c, jnp.complex128),
               jnp.asarray(x0k, jnp.complex128), jnp.asarray(x0v, jnp.complex128))
        _, vjp64 = jax.vjp(lambda *a: ref_scan64(*a, conj=conj, resets=jnp.asarray(resets)), *a64)
        g64 = vjp64((jnp.asarray(go, jnp.float64), jnp.asarray(gk, jnp.complex128),
                     jnp.asarray(gv, jnp.complex128)))
        g64 = [None if g is None else np.asarray(g) for g in g64]
    errs = {"o": rel(o, o_ref), "Xk": rel(xk, xk_ref), "Xv": rel(xv, xv_ref)}
    for n, g, gr in zip(["dfq", "dzk", "dzv", "dlam", "db", "dc", "dXk0", "dXv0"], grads, g64):
        if gr is not None and g is not None:
            errs[n] = rel(np.asarray(g), gr)
    worst = max(errs.values())
    status = "PASS" if worst <= tol else "FAIL"
    msg = (f"{status} {name}: worst {worst:.2e} (tol {tol:g}; gpu compile+run {t_gpu:.1f}s) "
           + " ".join(f"{k}={v:.1e}" for k, v in errs.items()))
    log(msg)
    SUMMARY.append(msg)
    return status == "PASS"


def check_vs_chunked(shape, T, tokens, dtype=jnp.bfloat16):
    """pallas vs the XLA chunked path at a benchmark shape (forward and input gradients)."""
    from idattn.bench.op import make_inputs
    from idattn.ops import interdomain_mix
    H, dh, M = shape
    B = tokens // T
    fq, zk, zv, lam, b, _ = make_inputs(B, T, H, dh, M, dtype)
    g = jax.random.normal(jax.random.PRNGKey(3), (B, T, H, dh), jnp.float32)

    def vg(impl, cast):
        def loss(fq, zk, zv, lam, b):
            o = interdomain_mix(fq.astype(cast), zk.astype(cast), zv.astype(cast), lam, b, impl=impl, chunk_size=64)
            return jnp.sum(o.astype(jnp.float32) * g), o
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))

    (_, o1), g1 = vg("pallas", dtype)(fq, zk, zv, lam, b)
    (_, o2), g2 = vg("chunked", jnp.float32)(fq, zk, zv, lam, b)
    errs = {"o": rel(o1.astype(jnp.float32), o2)}
    for n, a, r in zip(["dfq", "dzk", "dzv", "dlam", "db"], g1, g2):
        errs[n] = rel(np.asarray(a).astype(np.complex128 if np.iscomplexobj(r) else np.float64), np.asarray(r))
    worst = max(errs.values())
    msg = (f"{'PASS' if worst < 3e-2 else 'FAIL'} pallas({jnp.dtype(dtype).name}) vs chunked(f32) at {shape} T={T} "
           f"B={B}: " + " ".join(f"{k}={v:.1e}" for k, v in errs.items()))
    log(msg)
    SUMMARY.append(msg)


def probe_tuning(shapes, dtypes=("bfloat16",), deadline=None):
    """Compile (no run) value-and-grad of the operator at the benchmark tiles under each Triton tuning until one
    compiles for every shape and dtype; keep the first that does. Shared-memory limits are only known to the
    device compiler (and they depend on its Triton version). B = 256 // H rows of T = 128 tokens: the feature
    blocks are then whole (B·H >= 256), the largest tiles the benchmark uses; compile time does not grow with T."""
    from idattn.bench.op import mixer_fn
    from idattn.ops.pallas import gpu as G
    base = dict(G.TUNING)
    cands = [base, dict(base, bwd=(base["bwd"][0], 1)),
             {k: (w, 1) for k, (w, _) in base.items()},
             {k: (4, 1) for k in base}]
    for cand in cands:
        G.TUNING.clear()
        G.TUNING.update(cand)
        ok = True
        for (H, dh, M) in shapes:
            for dt in dtypes:
                if deadline is not None and time.time() > deadline:
                    log("probe: out of time, keeping the current tuning")
                    return dict(G.TUNING)
                B, T = max(1, 256 // H), 128
                sds = lambda *s, d=jnp.dtype(dt): jax.ShapeDtypeStruct(s, d)  # noqa: E731
                args = (sds(B, T, H, dh), sds(B, T, H, dh), sds(B, T, H, dh), sds(H, M, d=jnp.complex64),
                        sds(H, M, d=jnp.complex64), None, sds(B, T, H, dh, d=jnp.float32))
                t = time.time()
                try:
                    jax.jit(mixer_fn("pallas", "fwdbwd", 64, False)).lower(*args).compile()
                    log(f"probe tuning {cand} at {(H, dh, M)} {dt}: compiles ({time.time() - t:.1f}s)")
                except Exception as e:
                    ok = False
                    log(f"probe tuning {cand} at {(H, dh, M)} {dt}: FAILS {type(e).__name__}: {str(e)[:400]}")
                    break
            if not ok:
                break
        if ok:
            return cand
    G.TUNING.clear()
    G.TUNING.update(base)
    return None


# ----------------------------------------------------------------------------------------------------------------
# dependencies of (c) and (d) on a bare image

# What (c) and (d) import beyond jax / numpy: idattn.bench.model builds the trainer's RunPlan, whose checks read the
# data pipeline (grain, array_record) and the tokenizer (sentencepiece), and the trainer's pieces (orbax, msgpack,
# yaml through flax and orbax).
MODEL_DEPS = ("flax", "optax", "ml_collections", "orbax", "grain", "array_record", "sentencepiece", "msgpack", "yaml")
# Compiled packages (c) and (d) need that the device image lacks (its package list, read 2026-11-17, has flax,
# optax, orbax-checkpoint, tensorstore, msgpack, pyyaml, protobuf and sentencepiece): --make-deps fetches their
# wheels for the device's Python (--device-python, the image's 3.12) and unpacks them into the folder.
DEVICE_WHEELS = ("grain", "array-record")
# Packages the device image brings with jax itself (never copied: the image's own versions must win).
_IMAGE_OWN = {"jax", "jaxlib", "numpy", "ml_dtypes", "opt_einsum", "scipy", "jax_plugins", "nvidia", "libtpu",
              "jax_cuda12_plugin", "jax_cuda12_pjrt", "jax_cuda13_plugin", "jax_cuda13_pjrt", "idattn",
              "experiments", "_distutils_hack", "pkg_resources", "setuptools", "pip"}


def deps_missing():
    import importlib.util
    return [m for m in MODEL_DEPS if importlib.util.find_spec(m) is None]


def make_deps(dest, device_python="3.12"):
    """Copy the third-party pure-Python packages that idattn.models, idattn.bench.smoke and
    idattn.bench.model import (beyond jax / numpy / the image's own) from this environment into dest, then unpack
    into it the wheels of DEVICE_WHEELS (at this environment's versions) built for `device_python`."""
    import importlib
    import importlib.metadata
    import shutil
    import subprocess
    import sysconfig
    import tempfile
    import zipfile
    for m in ("optax", "flax.linen", "ml_collections", "idattn.models", "idattn.bench.smoke",
              "idattn.bench.model", "idattn.configs.scaling", "idattn.train.step"):
        importlib.import_module(m)
    stdlib = sysconfig.get_paths()["stdlib"]
    tops = sorted({m.split(".")[0] for m in list(sys.modules)} | set(MODEL_DEPS))
    os.makedirs(dest, exist_ok=True)
    copied, compiled, size = [], [], 0
    for top in tops:
        mod = sys.modules.get(top)
        f = getattr(mod, "__file__", None)
        if (top in _IMAGE_OWN or top.startswith("__editable__") or top in sys.builtin_module_names or f is None
                or "site-packages" not in f or f.startswith(stdlib + os.sep)):
            continue
        src = os.path.dirname(f) if os.path.basename(f) == "__init__.py" else f
        if os.path.isdir(src) and any(x.endswith((".so", ".pyd")) for _, _, fs in os.walk(src) for x in fs):
            compiled.append(top)  # built for this host's Python: useless on the device's, and often the bulk
            continue
        dst = os.path.join(dest, os.path.basename(src))
        if os.path.isdir(src):
            shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "tests"))
        else:
            shutil.copy2(src, dst)
        for root, _, files in os.walk(dst) if os.path.isdir(dst) else [(dest, None, [os.path.basename(dst)])]:
            size += sum(os.path.getsize(os.path.join(root, x)) for x in files)
        copied.append(top)
    print(f"copied {len(copied)} packages ({size / 2**20:.1f} MiB) into {dest}: {' '.join(copied)}")
    # the device's wheels: pip's own resolver picks the files for that Python and a manylinux x86-64 platform
    pins = [f"{n}=={importlib.metadata.version(n)}" for n in DEVICE_WHEELS]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--implementation",
               "cp", "--python-version", device_python, "-d", tmp, *pins]
        cmd += [x for n in (28, 27, 24, 17) for x in ("--platform", f"manylinux_2_{n}_x86_64")]
        r = subprocess.run(cmd + ["--platform", "manylinux2014_x86_64"], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"--make-deps: pip could not fetch {pins} for Python {device_python}: "
                             f"{r.stderr.strip().splitlines()[-1:]}; fetch them by hand into {dest} (unzipped)")
        for w in sorted(os.listdir(tmp)):
            zipfile.ZipFile(os.path.join(tmp, w)).extractall(dest)
            size += os.path.getsize(os.path.join(tmp, w))
            print(f"unpacked {w} (for Python {device_python}) into {dest}")
    compiled = [c for c in compiled if c not in {n.replace("-", "_") for n in DEVICE_WHEELS}]
    if compiled:
        print(f"not copied (compiled extensions the device image has itself): {' '.join(compiled)}")
    print(f"carry it to the device: run(..., carry=[{dest!r}])")


def run_module(args, timeout, extra_path=None):
    """Run `python -m ...` as a child (its own jax, its own failures), streaming its output; returns its
    output lines (exit status appended). The child is killed at `timeout` seconds whether or not it prints
    (a reader thread feeds a queue, so a silent child cannot hold the script past its budget)."""
    import queue
    import subprocess
    import threading
    env = dict(os.environ)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")] + ([extra_path] if extra_path else []))
    lines = []
    t = time.time()
    try:
        p = subprocess.Popen([sys.executable, "-u", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=env)
        q = queue.Queue()
        threading.Thread(target=lambda: ([q.put(x) for x in p.stdout], q.put(None)), daemon=True).start()
        while True:
            try:
                line = q.get(timeout=max(0.0, t + timeout - time.time()))
            except queue.Empty:
                line = ""
            if line is None:
                break
            if time.time() - t > timeout:
                p.kill()
                lines.append(f"(stopped after {timeout:.0f} s: time budget)")
                break
            line = line.rstrip("\n")
            if "cudart_stub" in line or "absl::InitializeLog" in line:
                continue
            lines.append(line)
            log("  | " + line)
        rc = p.wait()
        lines.append(f"(exit {rc}, {time.time() - t:.0f} s)")
    except Exception as e:  # noqa: BLE001
        lines.append(f"could not run {args}: {type(e).__name__}: {e}")
    log(lines[-1])
    return lines


# ----------------------------------------------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--budget-s", type=float, default=330.0, help="total wall-clock budget of this script")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on any backend (CPU: interpret mode)")
    p.add_argument("--skip", default="", help="comma list of sections to skip: probe,check,long (the T = 65,536 pallas vs chunked row of the check),table,kernels (per-kernel times),mosaic,smoke,model,extra")
    p.add_argument("--shapes", default="16,128,32;32,64,64", help="(H,d_h,M) list for the table")
    p.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--deps", default=None, help="folder of the packages (c), (d) need beyond the image (see --make-deps)")
    p.add_argument("--make-deps", default=None, metavar="DIR", help="build that folder here and exit")
    p.add_argument("--device-python", default="3.12", help="--make-deps: the device image's Python (X.Y)")
    a = p.parse_args()
    if a.make_deps:
        make_deps(a.make_deps, a.device_python)
        return
    global _LOGFILE
    if os.environ.get("OUT"):
        _LOGFILE = open(os.path.join(os.environ["OUT"], "gpu_check.log"), "w")
    skip = set(x for x in a.skip.split(",") if x)
    B = a.budget_s
    deadline = T0 + B
    on_gpu = jax.default_backend() == "gpu"
    dry = a.dry_run
    log(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}, budget {B:.0f}s"
        f"{' (dry run: tiny shapes)' if dry else ''}")
    if not on_gpu and not dry:
        log("no GPU backend: run with --dry-run to exercise the code paths on this host")
        return
    deps_dir = a.deps or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "gpu_deps")
    if deps_missing() and os.path.isdir(deps_dir):
        sys.path.append(deps_dir)
        log(f"model dependencies from {deps_dir}")
    else:
        deps_dir = None
    missing = deps_missing()
    log("model dependencies: " + ("all present" if not missing else f"MISSING {missing}: (c) and (d) will be "
                                  "skipped (make a folder with --make-deps on a CPU host and carry it)"))

    if dry:
        shapes, seqs, tokens = [(2, 32, 16)], [64, 128], 256
    else:
        shapes = [tuple(int(x) for x in sh.split(",")) for sh in a.shapes.split(";")]
        seqs, tokens = [int(x) for x in a.seqs.split(",")], a.tokens

    if (on_gpu or dry) and "probe" not in skip:
        log("=== (0) compile probe (Triton tuning, bf16 at the benchmark tiles) ===")
        tun = probe_tuning(shapes, deadline=T0 + 0.15 * B)
        log(f"using tuning {tun}")
        SUMMARY.append(f"triton tuning (num_warps, num_stages): {tun}")

    if "check" not in skip:
        log("=== (a) correctness vs float64 references (CPU) ===")
        if dry:
            cases = [("f32 conj c seg x0 R=D=24 T=40 (dry)", jnp.float32, True, 1, 40, 1, 24, 24, 4, 16, True, True,
                      True, 1e-4),
                     ("bf16 conj=False c seg x0 T=40 (dry)", jnp.bfloat16, False, 1, 40, 1, 16, 16, 4, 16, True, True,
                      True, 2e-2)]
        else:
            cases = [
                ("f32 conj c seg x0 R=D=96 T=300", jnp.float32, True, 2, 300, 2, 96, 96, 8, 64, True, True, True,
                 1e-4),
                ("f32 plain conj=False T=256", jnp.float32, False, 2, 256, 2, 64, 64, 16, 64, False, False, False,
                 1e-4),
                ("bf16 conj=False c seg x0 (16,128,32)-heads T=1000", jnp.bfloat16, False, 1, 1000, 2, 128, 128, 32,
                 64, True, True, True, 2e-2),
                ("bf16 conj c seg x0 R=D=96 T=300", jnp.bfloat16, True, 2, 300, 2, 96, 96, 8, 64, True, True, True,
                 2e-2),
                # two mode blocks of 32 (M = 64): a backward program per mode block (gpu.SPLIT_MODE_BLOCKS) with
                # the inline-PTX select (bwd_o) and jnp.where (bwd_p at M = 64), which the cases above (one mode
                # block) never reach
                ("bf16 conj c seg x0 (32,64,64)-heads T=300", jnp.bfloat16, True, 1, 300, 2, 64, 64, 64, 64, True,
                 True, True, 2e-2),
            ]
        for i, cs in enumerate(cases):
            if time.time() > T0 + 0.3 * B:
                log(f"skip {cs[0]} (time budget: the table comes first)")
                SUMMARY.append(f"SKIPPED (budget) {cs[0]}")
                continue
            try:
                check_case(*cs, seed=i)
            except Exception as e:
                log(f"ERROR {cs[0]}: {type(e).__name__}: {str(e)[:2000]}")
                SUMMARY.append(f"ERROR {cs[0]}: {type(e).__name__}: {str(e)[:300]}")
                traceback.print_exc(limit=3)

    from idattn.bench import op as bop
    from idattn.ops.pallas import op as pallas_op
    rows = []
    if "table" not in skip:
        log(f"=== (b) operator table: pallas vs {'cuDNN' if on_gpu else 'XLA'} causal attention, bf16, "
            f"{tokens:,} tokens/batch ===")
        for shape in shapes:
            for T in seqs:
                rows += bop.bench_case(shape, T, tokens, ["pallas"], ["fwd", "fwdbwd"], jnp.bfloat16,
                                       repeats=2 if dry else 10, warmup=1 if dry else 2, deadline=T0 + 0.62 * B)
        table = bop.format_table(rows)
        log("\n" + table)
        SUMMARY.append(table)
        # the 2026-12-04 form of the kernels (the per-token factors formed inside the loops: op.GPU_PRESCALED_SCAN
        # and GPU_PRESCALED_MODES off) beside the current one, in the same process, at the target shape
        old_rows = []
        from idattn.ops.pallas import gpu as pallas_gpu
        old_form = dict(GPU_PRESCALED_SCAN=False, GPU_PRESCALED_MODES=False, GPU_FUSED_FACTORS=False,
                        GPU_PARALLEL_FWD_MIN_T=8192)  # and the scans at 8 warps (gpu.TUNING before 2026-12-06)
        # and the kernels' own switches of 2026-12-07 off: no held tables, the dlamL sums in the backward, the
        # scans' products chained into the state, at M = 64 one backward program for both mode blocks, the scans
        # planned for 256 programs (the inline PTX and the masked loads stay: no switch; the backward's planes side
        # by side, gpu.MERGED_PLANES, need the per-token factors, which this form does not make)
        old_gpu = dict(HOLD_TABLES=False, BWD_HELD=(), YX_IN_SCAN=False, SCAN_UNCHAINED_MAX_STATE=0,
                       SPLIT_MODE_BLOCKS=False, SCAN_TARGET_PROGRAMS=256)
        saved = ({k: getattr(pallas_op, k) for k in old_form}, dict(pallas_gpu.TUNING),
                 {k: getattr(pallas_gpu, k) for k in old_gpu})
        for k, v in old_form.items():
            setattr(pallas_op, k, v)
        for k, v in old_gpu.items():
            setattr(pallas_gpu, k, v)
        pallas_gpu.TUNING["scan"] = (8, 2)
        try:
            for T in [t for t in (4096, 16384) if t in seqs] or seqs[-1:]:
                old_rows += bop.bench_case(shapes[0], T, tokens, ["pallas"], ["fwd", "fwdbwd"], jnp.bfloat16,
                                           repeats=2 if dry else 10, warmup=1 if dry else 2, attention=False,
                                           deadline=T0 + 0.66 * B, label="pallas 2026-12-04 form")
        finally:
            for k, v in saved[0].items():
                setattr(pallas_op, k, v)
            for k, v in saved[2].items():
                setattr(pallas_gpu, k, v)
            pallas_gpu.TUNING.clear()
            pallas_gpu.TUNING.update(saved[1])
        # at M > MODE_BLOCK the backward's program per mode block (since 2026-12-07) against one program for
        # every block (SPLIT_MODE_BLOCKS off), the rest of the kernels as they are now
        multi = [sh for sh in shapes if sh[2] > pallas_gpu.MODE_BLOCK]
        split_rows = []
        if multi and 4096 in seqs:
            pallas_gpu.SPLIT_MODE_BLOCKS = False
            try:
                split_rows = bop.bench_case(multi[0], 4096, tokens, ["pallas"], ["fwdbwd"], jnp.bfloat16,
                                            repeats=2 if dry else 10, warmup=1 if dry else 2, attention=False,
                                            deadline=T0 + 0.66 * B, label="pallas, mode blocks in one program")
            finally:
                pallas_gpu.SPLIT_MODE_BLOCKS = True
        else:
            log("(b1) the mode-block split pair: no shape with M > MODE_BLOCK at T = 4096 here (dry run)")
        t_old = bop.format_table([r for r in rows if r.impl == "pallas" and (tuple(r.shape) == tuple(shapes[0]) or
                                                                             (split_rows and r.T == 4096 and
                                                                              tuple(r.shape) == multi[0]))]
                                 + old_rows + split_rows)
        log("current kernels beside the 2026-12-04 form (and at M > 32 the mode blocks in one program):\n" + t_old)
        SUMMARY.append("(b1) current kernels beside the 2026-12-04 form (and at M > 32 the mode blocks in one "
                       "program):\n" + t_old)
        # the cost model (python -m idattn.bench gpu; constants fitted on the 2026-12-04 rows) beside this run
        from idattn.bench import gpu_model
        beside = gpu_model.beside_measured(rows + old_rows)
        log("cost model beside the measured times (a prediction from the compiled kernels):\n" + beside)
        SUMMARY.append("cost model vs measured:\n" + beside)

    if "kernels" not in skip:
        # where the time goes: every launch of a forward + backward timed alone (what the cost model needs to split
        # a program's time into kernels; the first device run had whole programs only)
        log("=== (b2) per-kernel times: every Pallas launch of fwd+bwd alone, bf16 ===")
        from idattn.bench import per_kernel as PK
        whole = {(tuple(r.shape), r.T, r.mode): r.ms for r in rows if r.impl == "pallas" and r.ms}
        cases = ([((2, 32, 16), 128, 256)] if dry else
                 [((16, 128, 32), 4096, tokens), ((32, 64, 64), 4096, tokens), ((16, 128, 32), 16384, tokens)])
        for shape, T, tok in cases:
            if time.time() > T0 + 0.68 * B:
                SUMMARY.append(f"(b2) per-kernel {shape} T={T} SKIPPED (time budget)")
                continue
            try:
                krows = PK.per_kernel_times(shape, T, tok, "fwdbwd", jnp.float32 if dry else jnp.bfloat16,
                                            chunk=16 if dry else 64, interpret=True if dry else None,
                                            repeats=1 if dry else 10, deadline=T0 + 0.72 * B, log=log)
                text = PK.format_rows(shape, T, tok, "fwdbwd", krows, whole.get((shape, T, "fwdbwd")))
            except Exception as e:
                text = f"(b2) per-kernel {shape} T={T} ERROR {type(e).__name__}: {str(e)[:300]}"
            log(text)
            SUMMARY.append(text)
        # the serial scans' plan where B·H < 256 (16K): gpu.SCAN_TARGET_PROGRAMS 128 (one program per SM, [32, 64]
        # state tiles, since 2026-12-07) against 256 (two per SM, [32, 32]), the scan launches alone
        from idattn.ops.pallas import gpu as pallas_gpu
        shape, T, tok = cases[-1]
        if time.time() > T0 + 0.70 * B:
            SUMMARY.append(f"(b2) scans at 256 programs {shape} T={T} SKIPPED (time budget)")
        else:
            saved_target = pallas_gpu.SCAN_TARGET_PROGRAMS
            pallas_gpu.SCAN_TARGET_PROGRAMS = 256
            try:
                krows = PK.per_kernel_times(shape, T, tok, "fwdbwd", jnp.float32 if dry else jnp.bfloat16,
                                            chunk=16 if dry else 64, interpret=True if dry else None,
                                            repeats=1 if dry else 10, deadline=T0 + 0.72 * B, log=log,
                                            only=("idattn_scan",))
                text = ("(b2) the scans with gpu.SCAN_TARGET_PROGRAMS = 256 (before 2026-12-07), beside the rows "
                        "above:\n" + PK.format_rows(shape, T, tok, "fwdbwd", krows))
            except Exception as e:
                text = f"(b2) scans at 256 programs {shape} T={T} ERROR {type(e).__name__}: {str(e)[:300]}"
            finally:
                pallas_gpu.SCAN_TARGET_PROGRAMS = saved_target
            log(text)
            SUMMARY.append(text)

    if "mosaic" not in skip:
        # the same scan math as Triton's scan_fwd_k at (32, 64, 64), written for Mosaic GPU: equal instructions per
        # chunk and warp when compiled here (343) and 3 programs per SM for both (its shared memory bounds it as
        # Triton's registers do), TMA loads, asynchronous wgmma; its time beside (b2)'s idattn_scan_fwd_k row says
        # whether Mosaic's scheduling is worth a port at equal issue (the cost model says it is not)
        log("=== (b3) the Mosaic GPU scan probe (idattn.bench.mosaic_scan) ===")
        if dry or not on_gpu:  # the kernel needs a GPU (Mosaic GPU's interpret mode in jax 0.10 runs neither
            # run_state nor layout_cast): the rest of the row (inputs, float64 reference, timing) with an XLA stand-in
            from idattn.bench import mosaic_scan
            text = (mosaic_scan.check_and_time(H=2, N=64, T=128, tokens=128, repeats=1, scan=mosaic_scan.xla_scan)
                    + f" [{'dry run' if dry else 'no GPU'}; on a GPU: the kernel at (32, 64, 64) T=4096 65,536 "
                    "tokens, ~15 s]")
        elif time.time() > T0 + 0.74 * B:
            text = "(b3) Mosaic GPU scan probe SKIPPED (time budget)"
        else:
            try:
                from idattn.bench import mosaic_scan
                text = mosaic_scan.check_and_time(H=32, N=64, T=4096, tokens=tokens)
            except Exception as e:  # a jax whose plgpu API moved: say so, never stop the run
                text = f"(b3) Mosaic GPU scan probe ERROR {type(e).__name__}: {str(e)[:300]}"
        log(text)
        SUMMARY.append(text)

    if "smoke" not in skip:
        log("=== (c) python -m idattn.bench.smoke ===")
        if missing:
            SUMMARY.append(f"(c) gpu_smoke SKIPPED: missing {missing}")
        elif time.time() > T0 + 0.72 * B:
            SUMMARY.append("(c) gpu_smoke SKIPPED (time budget)")
        else:
            out = run_module(["-m", "idattn.bench.smoke"] + (["--tiny"] if dry else []),
                             timeout=T0 + 0.72 * B - time.time() + 20, extra_path=deps_dir)
            SUMMARY.append("(c) gpu_smoke:\n" + "\n".join(out))

    if "model" not in skip:
        log("=== (d) python -m idattn.bench model: 125M softmax vs interdomain ===")
        if missing:
            SUMMARY.append(f"(d) bench model SKIPPED: missing {missing}")
        elif time.time() > T0 + 0.92 * B:
            SUMMARY.append("(d) bench model SKIPPED (time budget)")
        else:
            args = (["--size", "tiny", "--seq", "64", "--batch", "1", "--repeats", "1", "--decode-contexts", "32,64",
                     "--decode-batch", "1,2", "--decode-steps", "2"] if dry else
                    ["--size", "125m", "--seq", "4096,16384", "--tokens", "32768", "--repeats", "3",
                     "--decode-contexts", "1024,4096,16384", "--decode-batch", "1,8", "--decode-steps", "10"])
            out = run_module(["-m", "idattn.bench", "model", "--mixers", "softmax,interdomain"] + args,
                             timeout=T0 + 0.92 * B - time.time(), extra_path=deps_dir)
            SUMMARY.append("(d) bench model:\n" + "\n".join(out))

    if "extra" not in skip and time.time() < deadline - 15:
        log("=== (e) while the budget lasts: pallas variants (recompute, chunk 128), XLA chunked, decode step ===")
        rows2 = []
        T_var = [t for t in (4096, 16384) if t in seqs] or seqs[-1:]
        for T in T_var:
            rows2 += bop.bench_case(shapes[0], T, tokens, ["pallas"], ["fwdbwd"], jnp.bfloat16, repeats=5,
                                    attention=False, deadline=deadline - 10, pallas_kwargs={"save_states": False},
                                    label="pallas recompute")
            rows2 += bop.bench_case(shapes[0], T, tokens, ["pallas"], ["fwdbwd"], jnp.bfloat16, chunk=128,
                                    repeats=5, attention=False, deadline=deadline - 10, label="pallas L128")
            if T >= pallas_op.GPU_PARALLEL_FWD_MIN_T:  # the serial forward where the chunk-parallel one is the default
                saved, pallas_op.GPU_PARALLEL_FWD_MIN_T = pallas_op.GPU_PARALLEL_FWD_MIN_T, 1 << 40
                try:
                    rows2 += bop.bench_case(shapes[0], T, tokens, ["pallas"], ["fwd", "fwdbwd"], jnp.bfloat16,
                                            repeats=5, attention=False, deadline=deadline - 10,
                                            label="pallas serial fwd")
                finally:
                    pallas_op.GPU_PARALLEL_FWD_MIN_T = saved
        for shape in shapes:
            for T in T_var:
                rows2 += bop.bench_case(shape, T, tokens, ["chunked"], ["fwd", "fwdbwd"], jnp.bfloat16, repeats=3,
                                        warmup=1, attention=False, deadline=deadline - 10)
        attn_rows = [r for r in rows if r.impl == "attention"]
        t2 = bop.format_table(attn_rows + rows2)
        log("\n" + t2)
        SUMMARY.append("(e) variants (attention rows repeated from (b)):\n" + t2)
        if time.time() < deadline - 15:
            for shape in shapes:
                SUMMARY.extend(bop.bench_decode(shape, batches=(1, 64), repeats=5 if dry else 50))
    elif "extra" not in skip:
        SUMMARY.append("(e) variants SKIPPED (time budget)")

    # last: pallas vs the XLA chunked path at T = 65,536 (~140 s on an H200, 2026-12-04, mostly the chunked
    # reference's compile and run; run inside (a) it used up the table's budget): only with that much time left
    if "check" not in skip and "long" not in skip:
        # (the dry row takes ~8 s on an idle 2-core host, up to twice that under a parallel test run; it must
        # respect the deadline too: CI saw 151 s of a 150 s budget when it did not)
        long_rows = [((2, 32, 16), 128, 128, 20)] if dry else [((16, 128, 32), 65536, 65536, 150)]
        for (shape, T, tok, need_s) in long_rows:
            if time.time() > deadline - need_s:
                SUMMARY.append(f"SKIPPED (budget: ~{need_s - 10} s) pallas vs chunked at {shape} T={T}")
                continue
            try:
                check_vs_chunked(shape, T, tok)
            except Exception as e:
                log(f"ERROR pallas vs chunked T={T}: {type(e).__name__}: {str(e)[:1000]}")
                SUMMARY.append(f"ERROR pallas vs chunked T={T}: {type(e).__name__}: {str(e)[:300]}")
    print("\n======================== SUMMARY ========================", flush=True)
    print(f"jax {jax.__version__} {jax.devices()}  total {time.time() - T0:.0f} s of {B:.0f} s budget", flush=True)
    for line in SUMMARY:
        print(line, flush=True)
        if _LOGFILE is not None:
            _LOGFILE.write(line + "\n")
    log("done")


if __name__ == "__main__":
    main()
