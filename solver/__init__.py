"""The solver side: prompts, answer parsing, single- and multi-turn episodes (the hybrid action space) and
solver rewards. Imports only `sandbox` and the task schema from `generator`."""
