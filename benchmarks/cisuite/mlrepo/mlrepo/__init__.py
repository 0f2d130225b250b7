"""A small image classifier and a tiny language model, trained on synthetic data."""
