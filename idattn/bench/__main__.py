"""python -m idattn.bench {op,theory,model,tpu,gpu,checksum} [flags]   (each subcommand has --help)."""
import argparse
import importlib
import sys

COMMANDS = {
    "op": "interdomain_mix implementations vs causal softmax attention (ms, tok/s, temp memory)",
    "theory": "LegS convergence table (idattn.ops.theory)",
    "model": "training tok/s and MFU per mixer (the trainer's step), decode tok/s vs context (needs flax)",
    "tpu": "static model of the TPU kernels: grid steps, VMEM, HBM bytes, FLOPs, v5p / v6e roofline vs splash",
    "gpu": "cost model of the fused GPU kernels from their SASS, fitted and tested on the H200 run (no GPU needed)",
    "checksum": "cost of the checkpoint checksums vs one read of the state (idattn.rundir.integrity)",
}

# subcommand -> its module, loaded only when chosen: `model` (flax, optax) and `checksum` (idattn.rundir:
# ml_collections) need more than jax + numpy; the others run on a bare accelerator image
MODULES = {"op": "op", "theory": "theory", "model": "model", "tpu": "tpu_model", "gpu": "gpu_model",
           "checksum": "checksum"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m idattn.bench", formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="Benchmarks; each prints ratios side by side in one run.\n\n" + "\n".join(
                                     f"  {k:<9} {v}" for k, v in COMMANDS.items()))
    ap.add_argument("command", choices=tuple(COMMANDS))
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the subcommand's flags (python -m idattn.bench op -h)")
    a = ap.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        module = importlib.import_module(f"idattn.bench.{MODULES[a.command]}")
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] == "idattn":
            raise
        ap.exit(2, f"error: python -m idattn.bench {a.command} needs {e.name}, not installed here "
                   f"(pip install -e . brings it)\n")
    module.main(a.args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
