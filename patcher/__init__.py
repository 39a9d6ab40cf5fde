"""dynspec: patch SGLang so EAGLE speculative decoding switches off under load and back on."""

__version__ = "0.1.0"
