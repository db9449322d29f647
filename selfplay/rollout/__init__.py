"""Rollouts: the solver's episodes and the generator's proposals as PPO-ready token data; constrained decoding."""
