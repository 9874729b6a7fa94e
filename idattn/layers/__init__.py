"""idattn.layers."""
