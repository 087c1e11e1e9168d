"""The model: timm names and creation (`registry`), token geometry (`geometry`), token-truncated forwards."""
