"""Launchers: local processes (local), SLURM jobs (slurm), Cloud TPU slices (tpu). Each is
`python -m idattn.launch.<name>` and `launch/<name>.py` in a source checkout."""
