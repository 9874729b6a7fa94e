"""idattn.eval."""
