"""Layer kind 'weighted' (being written)."""
