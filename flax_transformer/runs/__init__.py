"""The application layer: one typed spec and one function per workflow, between the library
rooms and the commands. cli/ parses argv, builds the spec, calls the function here and maps the
outcome to an exit status; nothing here knows of argparse.

- spec.py: TrainSpec, and its record in run.json (schema 2; the 0.2 form read too)
- checks.py: the checks and implications of a TrainSpec (workdir, model kind, config values)
- train.py: `train(spec, hooks) -> results`; train_data.py: its input; train_classify.py: the
  run files a classifier's labels come from
- workdir.py: the run directory before training (writable, one run, the lock)
- resume.py: --resume with settings that differ from the run's
- generate.py: GenerateOptions, prepare(run, options) -> Generator, generate_lines
- score.py: score(ScoreSpec) -> scores; export.py: export(ExportSpec) -> what was written
"""
