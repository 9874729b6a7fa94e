"""idattn.data."""
