"""Layer kind 'mute' (being written)."""
