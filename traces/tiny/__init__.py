"""The tiny MoE trained in this repository: its corpus, training and location."""
