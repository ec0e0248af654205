"""The run files a `--task classify` run's label set comes from, read with the run directories
(runs/train.read_run_dirs), before the processes join and before any data: on --resume the
run's labels.json and hf_config.json, else the --init-from run's hf_config.json and whether its
model ends in a sequence classifier. The labelled files themselves are read by the input
(data/classify_input.py), with the other data."""

from __future__ import annotations

from pathlib import Path

from flax_transformer.runs import run_dir
from flax_transformer.runs.spec import UsageError


def classifier_run_files(spec, workdir: Path) -> dict:
    """The ClassifyInput values that come from run files (hf_config, and run_labels on --resume,
    else init_id2label and init_from); a UsageError names a file that is missing."""
    if spec.resume:
        names = run_dir.read_labels(workdir)
        if names is None:
            raise UsageError(f"--resume --task classify: {workdir} has no labels.json")
        return {"hf_config": read_hf_config(workdir), "run_labels": names}
    init = Path(spec.init_from)
    hf_config = read_hf_config(init)
    classifier = run_dir.read_config(init).head.startswith("sequence")  # its id2label counts
    id2label = hf_config.get("id2label") if classifier else None
    return {"hf_config": hf_config, "init_id2label": id2label, "init_from": init}


def read_hf_config(directory: Path) -> dict:
    """A run's hf_config.json: a classifier is exported to Hugging Face, so its encoder must
    come from there."""
    hf_config = run_dir.read_carried_json(directory, run_dir.HF_CONFIG)
    if hf_config is None:
        raise UsageError(
            f"--task classify: {directory} has no {run_dir.HF_CONFIG}; start from an "
            "`ftx hf import` of a BERT, RoBERTa, XLM-RoBERTa or DistilBERT model"
        )
    return hf_config
