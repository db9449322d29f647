"""Models: the factory that builds any Hugging Face causal LM or the tiny default, and one trainable agent."""
