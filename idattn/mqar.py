"""`python -m idattn.mqar`: MQAR runs of the small models (the library is idattn.studies.mqar)."""
import sys

from idattn.studies.mqar import main

if __name__ == "__main__":
    sys.exit(main())
