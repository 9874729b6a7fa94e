"""idattn.studies: what is built from many runs: scaling fits, the reproduction, result tables, the quickstart.
Each module is a library with a `main(argv)`; the commands are the thin `idattn/<name>.py` entries
(`python -m idattn.scaling`, `.results`, `.repro`, `.quickstart`).
"""
