"""The RL math (core.py: log-probs, advantages, the PPO loss), the PPO trainer both agents share, replay, SFT."""
