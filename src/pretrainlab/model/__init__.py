from pretrainlab.config import ConfigError
from pretrainlab.model.encoder import Embeddings, Encoder, EncoderConfig, EncoderOutput

__all__ = ["ConfigError", "Embeddings", "Encoder", "EncoderConfig", "EncoderOutput"]
