"""`python -m idattn.repro`: the reproduction: train the small models and write docs/reproduction.md's tables with verdicts.

The command only; the library is idattn.studies.repro (its docstring has the usage, `--help` the flags)."""
import sys

from idattn.studies.repro import main

if __name__ == "__main__":
    sys.exit(main())
