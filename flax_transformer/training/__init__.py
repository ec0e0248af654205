"""Training: state, optimizer, loss and steps, the loop, checkpoints, evaluation, plots,
sharding, run directories (and loading a run). The data it trains on comes from
`flax_transformer.data`."""
