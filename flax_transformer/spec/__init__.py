"""Framework-neutral facts (numpy only): the config, the naming rule, the sinusoid, error measures.

Nothing here imports JAX or torch; both twins and every tool read these.
"""
