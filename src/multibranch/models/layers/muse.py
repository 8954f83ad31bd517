"""Layer kind 'muse' (being written)."""
