"""idattn.train."""
