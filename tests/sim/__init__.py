"""Tests of the embedded SGLang simulator (`autotune.sim`)."""
