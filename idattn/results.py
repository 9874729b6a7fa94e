"""`python -m idattn.results`: the paper's tables and figures from finished run directories.

The command only; the library is idattn.studies.results (its docstring has the usage, `--help` the flags)."""
import sys

from idattn.studies.results import main

if __name__ == "__main__":
    sys.exit(main())
