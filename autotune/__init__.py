"""autotune: tunes an SGLang server's memory settings for the most KV capacity without OOM."""

__version__ = "0.1.0"
