"""The linen model: attention, dropout, layers, blocks, the two models and their kinds."""
