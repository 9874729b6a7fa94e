"""python -m idattn.bench {op,theory,model,checksum} [flags]   (each subcommand has --help)."""
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    cmds = ("op", "theory", "model", "checksum")
    if not argv or argv[0] not in cmds:
        print(__doc__)
        print("  op      interdomain_mix implementations vs causal softmax attention (ms, tok/s, temp memory)")
        print("  theory  LegS convergence table (idattn.ops.theory)")
        print("  model   training tok/s and MFU per mixer, decode tok/s vs context (needs flax)")
        print("  checksum  cost of the checkpoint checksums vs one read of the state (idattn.rundir.integrity)")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "op":
        from idattn.bench import op
        op.main(rest)
    elif cmd == "theory":
        from idattn.bench import theory
        theory.main(rest)
    elif cmd == "checksum":
        from idattn.bench import checksum
        checksum.main(rest)
    else:
        from idattn.bench import model
        model.main(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
