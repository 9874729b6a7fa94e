"""idattn.models."""
