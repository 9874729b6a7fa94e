"""`python -m idattn.scaling`: scaling-law fits (Chinchilla approach 3, IsoFLOP parabolas) over a sweep's runs, with bootstrap bands.

The command only; the library is idattn.studies.scaling (its docstring has the usage, `--help` the flags)."""
import sys

from idattn.studies.scaling import main

if __name__ == "__main__":
    sys.exit(main())
