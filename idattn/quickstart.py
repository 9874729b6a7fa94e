"""`python -m idattn.quickstart`: the quickstart: tiny Softmax, Interdomain and S4D-only models on the embedded corpus, one table.

The command only; the library is idattn.studies.quickstart (its docstring has the usage, `--help` the flags)."""
import sys

from idattn.studies.quickstart import main

if __name__ == "__main__":
    sys.exit(main())
