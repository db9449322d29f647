"""Training: the self-play loop, the adaptive difficulty mixer, and the warm start that precedes it."""
