"""Evaluation: held-out splits and HumanEval, pass@k, plots, and the comparison of training arms."""
