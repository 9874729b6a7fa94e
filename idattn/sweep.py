"""`python -m idattn.sweep`: scaling sweeps: run every config of a sweep file locally, as a SLURM job array, or as TPU jobs.

The command only; the library is idattn.launch.sweep (its docstring has the usage, `--help` the flags)."""
import sys

from idattn.launch.sweep import main

if __name__ == "__main__":
    sys.exit(main())
