"""TensorBoard event files of a run: `tensorboard --logdir runs/` shows every workdir's
`tensorboard/` folder.

`TensorBoardLog.write(record)` takes the records metrics.jsonl gets (train: loss, lr, grad
norm, tokens/s; eval: validation loss, token accuracy, exact match) and writes them as scalars
"train/<name>" and "valid/<name>" at their step; `image` and `text` add the attention heatmap
and the decoded examples. The event format is tensorboardX's (pure Python, no TensorFlow),
written without its background thread (see TensorBoardLog).

Resume: a resumed run opens the writer with `purge_step` = the checkpoint's step + 1. The
event file then starts with a restart marker, and TensorBoard's reader drops every event the
interrupted run wrote after the checkpoint, so each step is shown once (the same steps
metrics.jsonl forgets, see loop.truncate_metrics).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

# metrics.jsonl record key -> scalar name, per record kind
_TRAIN = {"train_loss": "loss", "lr": "lr", "grad_norm": "grad_norm"}
_TRAIN |= {"tokens_per_sec": "tokens_per_sec"}
_EVAL = {"valid_loss": "loss", "token_accuracy": "token_accuracy", "exact_match": "exact_match",
         "accuracy": "accuracy", "macro_f1": "macro_f1"}  # fmt: skip


class TensorBoardLog:
    """The run's event file in tensorboard/: metrics records as scalars, pictures and decoded
    examples, written in the calling thread.

    tensorboardX's SummaryWriter writes from a thread of its own and closes from an atexit
    hook: a full disk then printed two tracebacks, and the run's error named no file. Here
    its EventsWriter and summary protos are used directly, synchronously: the first failed
    write raises an OSError naming the event file (the run's one-line disk-full message), and
    the log then stops writing, so a close on the way out never raises a second error."""

    def __init__(self, directory: Path, purge_step: int | None = None, flush_secs: float = 30):
        from tensorboardX.event_file_writer import EventsWriter  # imported when a run starts

        self.directory = Path(directory)
        self.failure: OSError | None = None
        self.flush_secs, self._flushed = flush_secs, time.monotonic()
        self._events = None
        self._guarded(self._open, EventsWriter)
        if purge_step is not None:  # TensorBoard drops the events of later steps before this
            from tensorboardX.proto.event_pb2 import Event, SessionLog

            start = SessionLog(status=SessionLog.START)
            self._add(Event(step=purge_step, file_version="brain.Event:2"))
            self._add(Event(step=purge_step, session_log=start))

    def _open(self, events_writer) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._events = events_writer(str(self.directory / "events"))

    @property
    def path(self) -> Path:
        """The event file (the directory until it is opened)."""
        name = getattr(self._events, "_file_name", None)
        return Path(name) if name else self.directory

    def _guarded(self, write, *args) -> None:
        """Run one write; the first OSError is kept as `failure` and raised naming the event
        file; after it, nothing is written."""
        if self.failure is not None:
            return
        try:
            write(*args)
        except OSError as err:
            self.failure = OSError(err.errno, err.strerror or str(err), str(self.path))
            raise self.failure from None

    def _add(self, event) -> None:
        if self.failure is not None:
            return
        self._guarded(self._events.write_event, event)
        if time.monotonic() - self._flushed > self.flush_secs:
            self.flush()

    def _summary(self, summary, step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event

        self._add(Event(summary=summary, step=int(step), wall_time=time.time()))

    def write(self, record: dict) -> None:
        """One metrics.jsonl record: {"kind": "train" | "eval", "step": ..., values...}."""
        from tensorboardX.summary import scalar

        prefix, names = ("train", _TRAIN) if record["kind"] == "train" else ("valid", _EVAL)
        for key, name in names.items():
            if key in record:
                self._summary(scalar(f"{prefix}/{name}", float(record[key])), record["step"])

    def image(self, tag: str, png: Path, step: int) -> None:
        """A PNG written by plots.py, as an image summary."""
        import matplotlib.image
        from tensorboardX.summary import image

        pixels = matplotlib.image.imread(png)  # (height, width, channels) floats in [0, 1]
        self._summary(image(tag, np.asarray(pixels[..., :3]), dataformats="HWC"), step)

    def examples(self, examples: list[dict], step: int) -> None:
        """Decoded validation examples as a markdown table (a text summary)."""
        from tensorboardX.summary import text

        rows = ["| source | reference | hypothesis |", "|---|---|---|"]
        for ex in examples:
            cells = (ex["source"], ex["reference"], ex["hypothesis"])
            rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        self._summary(text("valid/examples", "\n".join(rows)), step)

    def flush(self, quietly: bool = False) -> None:
        """Write pending events to disk now. `quietly`: a failure is only kept in `failure`
        (for a run already stopping with an error of its own, which is the one to say)."""
        self._flushed = time.monotonic()
        if self.failure is not None:
            return
        try:
            self._guarded(self._events.flush)
        except OSError:
            if not quietly:
                raise

    def close(self) -> None:
        """Flush (quietly: see `failure`) and close the event file; safe to call twice."""
        if self._events is None:
            return
        self.flush(quietly=True)
        try:
            self._events.close()
        except OSError:
            pass  # a failed flush already said what went wrong
        self._events = None


def _cell(text: str) -> str:
    # Markdown: a '|' would end the cell; backticks keep spaces and symbols visible.
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"
