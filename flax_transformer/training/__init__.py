"""Training: state, optimizer, loss and steps, the loop, checkpoints, data, tokenizers,
evaluation, plots, sharding, run directories."""
