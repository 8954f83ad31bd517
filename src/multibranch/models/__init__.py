"""Models: the typed ModelConfig, the layer kinds registered under it, and the seq2seq model.

Importing this package registers every layer kind (explicit imports, no directory scanning).
"""

from multibranch.models.config import DropHeadConfig, LayerConfig, ModelConfig
from multibranch.models.layers import muse as _muse  # noqa: F401  (registers "muse")
from multibranch.models.layers import mute as _mute  # noqa: F401  (registers "mute")
from multibranch.models.layers import transformer as _transformer  # noqa: F401  (registers "transformer")
from multibranch.models.layers import weighted as _weighted  # noqa: F401  (registers "weighted")
from multibranch.models.seq2seq import EncoderOut, Seq2SeqModel

__all__ = ["DropHeadConfig", "EncoderOut", "LayerConfig", "ModelConfig", "Seq2SeqModel", "build_model"]


def build_model(cfg: ModelConfig) -> Seq2SeqModel:
    """Build a freshly initialised model from its config."""
    return Seq2SeqModel(cfg)
