"""A real-data case the project builds itself, without a download: sklearn's bundled 8 x 8 digits as an
ImageFolder (`folder`) and a ViT trained on it a few epochs on the CPU, cached (`model`). Needs
scikit-learn (the dev extra)."""
