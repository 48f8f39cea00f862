"""Reference models: a Llama-style decoder LM with named sizes."""

from .decoder import SIZES, Decoder, DecoderConfig, decoder

__all__ = ["SIZES", "Decoder", "DecoderConfig", "decoder"]
