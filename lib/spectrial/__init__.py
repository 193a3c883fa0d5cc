"""spectrial: controlled, reproducible trials of speculative decoding on real inference servers."""

__version__ = "0.1.0"
