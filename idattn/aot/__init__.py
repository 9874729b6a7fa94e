"""Ahead-of-time compilation for TPU / GPU targets on any host (`python -m idattn.aot`)."""
