"""multibranch: multi-branch Transformers (MAT, Weighted Transformer, MUTE, MUSE, Scheduled DropHead)."""

__version__ = "0.1.0"
