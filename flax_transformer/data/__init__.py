"""Data: tasks and TSV corpora, corpus reading, tokenizers, the token cache, token-budget
batches and packing (below training/, which runs the steps on what this room reads)."""
