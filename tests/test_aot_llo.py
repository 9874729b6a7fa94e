"""idattn.aot.llo: counting a Mosaic kernel's LLO per grid step, on hand-written dump text (a loop's body once per
trip of its constant bounds, an scf.if block once, ops sorted by unit, the index-map functions skipped); and, where
libtpu is installed (-m slow), on a real dump of the operator's forward compiled for v5p."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from idattn.aot import llo
from tests import train_helpers as T

DUMP = """module {
  func.func @idattn_tpu_fwd_p(%arg0: i32 {llo.type = i32}) attributes {iteration_bounds = array<i64: 2, 8, 4>} {
    %0 = llo.constant {value = 0 : i32} : i32
    %1 = llo.constant {value = 3 : i32} : i32
    %2 = llo.constant {value = 1 : i32} : i32
    %c = llo.constant {value = dense<0.0> : vector<8x128xf32>} : vector<8x128xf32>
    %3 = llo.seq.s32 %arg0, %0
    scf.if %3 {
      %4 = llo.vector_load %arg0 : i32 -> vector<8x128xf32>
      llo.vector_store %4 into %arg0 : vector<8x128xf32> into i32
    } {in_layout = []}
    scf.for %i = %0 to %1 step %2  : i32 {
      %5 = llo.vadd.f32 %c, %c : vector<8x128xf32>
      %6 = llo.vmul.f32 %5, %c : vector<8x128xf32>
      "llo.vlatch"(%6) <{gain_latch_mode = #llo.gain_latch_mode<xpose.packed.bf16>, mxu_id = 0 : i32}> : (vector<8x128xf32>) -> ()
      %7 = llo.vmatmul %6 {matmul_mode = #llo.matmul_mode<x>} : vector<8x128xf32>
      %8 = llo.vmatres : vector<8x128xf32>
      %9 = llo.vxpose %8 {vxpose_mode = #llo.vxpose_mode<a>} : vector<8x128xf32>
      %10 = llo.vrecip %9 : vector<8x128xf32>
      scf.for %j = %0 to %1 step %2  : i32 {
        %11 = llo.vsub.f32 %9, %10 : vector<8x128xf32>
      }
    }
    return
  }
  func.func @transform_0(%arg0: i32 {llo.type = i32}) -> (i32) {
    %0 = llo.vadd.s32 %arg0, %arg0 : i32
    return %0 : i32
  }
}
"""


def test_counts_per_grid_step_by_unit():
    k = llo.count_kernels(DUMP)
    assert list(k) == ["idattn_tpu_fwd_p"]  # the index map is not a kernel
    c = k["idattn_tpu_fwd_p"]
    assert c["grid"] == (2, 8, 4) and c["dynamic_loops"] == 0
    # per trip of the outer loop (3): vadd, vmul, vsub x 3 -> 5 vpu; one push; a latch and a pop; a transpose;
    # a reciprocal; the if-block's load and store once; the compare on the scalar unit
    assert c["vpu"] == 3 * 5 and c["mxu"] == 3 and c["mxu_io"] == 6 and c["xlu"] == 3 and c["eup"] == 3
    assert c["load"] == 1 and c["store"] == 1 and c["scalar"] == 1
    table = llo.format_counts(k)
    assert "| fwd_p | (2, 8, 4) | 3 | 6 | 15 |" in table


def test_units_of_op_names():
    assert [llo.unit_of(x) for x in ("vmatmul", "vmatres", "vexp", "vperm", "vector_store_masked", "sadd",
                                     "constant", "vselect")] == [
        "mxu", "mxu_io", "eup", "xlu", "store", "scalar", None, "vpu"]


@pytest.mark.slow
def test_a_real_dump_of_the_forward(tmp_path):
    """The operator's forward compiled for one v5p chip with Mosaic's dump on: both kernels are read, each with MXU
    pushes and a vpu count far above them (the complex products with the decay tables are elementwise)."""
    pytest.importorskip("libtpu")
    script = (
        "import jax, jax.numpy as jnp\n"
        "from jax.sharding import SingleDeviceSharding\n"
        "from idattn.aot.tpu import tpu_target\n"
        "from idattn.ops.pallas.op import interdomain_mix_pallas\n"
        "sh = SingleDeviceSharding(tpu_target('v5p:1x1x1').devices[0])\n"
        "sd = lambda s, d: jax.ShapeDtypeStruct(s, d, sharding=sh)\n"
        "f = lambda q, k, v, l, b: interdomain_mix_pallas(q, k, v, l, b, None, conj=True, chunk_size=128, "
        "segment_ids=None, initial_state=None, return_state=False, out_dtype=None, interpret=False, family='tpu')\n"
        "x = sd((1, 1024, 4, 128), jnp.bfloat16)\n"
        "jax.jit(f).lower(x, x, x, sd((4, 32), jnp.complex64), sd((4, 32), jnp.complex64)).compile()\n")
    env = dict(T.subprocess_env(), ALLOW_MULTIPLE_LIBTPU_LOAD="1",
               LIBTPU_INIT_ARGS=f"--xla_mosaic_dump_to={tmp_path}")
    proc = subprocess.run([sys.executable, "-c", script], cwd=T.REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    k = llo.read_dumps(str(tmp_path))
    assert set(k) == {"idattn_tpu_fwd_p", "idattn_tpu_fwd_o"}, sorted(k)
    for c in k.values():
        assert c["mxu"] > 0 and c["vpu"] > 10 * c["mxu"] and c["dynamic_loops"] == 0, c
    assert os.listdir(tmp_path)
