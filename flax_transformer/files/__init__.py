"""Files written whole or not at all, and text read line by line (plain Python, no JAX).

- `atomic_io`: atomic writes (a temporary file in the same directory, then a rename), output-path
  checks.
- `modes`: the umask's mode for files written by libraries that ignore it (safetensors).
- `text_lines`: decoding one line of a text file with the line number named in the error.
"""
