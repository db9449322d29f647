"""What every run stands on: the config, errors, torch.distributed/DeepSpeed, checkpoints, TensorBoard."""
