from pretrainlab.model.encoder import ConfigError, Embeddings, Encoder, EncoderConfig, EncoderOutput

__all__ = ["ConfigError", "Embeddings", "Encoder", "EncoderConfig", "EncoderOutput"]
