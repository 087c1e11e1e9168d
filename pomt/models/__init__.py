"""The model: timm names and creation (`registry`), token geometry read from the model (`geometry`), and
forwards that keep only n tokens after embedding (`tokens`)."""
