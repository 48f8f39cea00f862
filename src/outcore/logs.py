"""The run log: one row per step to JSONL, CSV and (when installed) TensorBoard.

OUTPUT_DIR/metrics.jsonl, OUTPUT_DIR/metrics.csv, OUTPUT_DIR/tensorboard/. On resume from
step k, rows after k (written before a crash, then redone) are dropped, so the log reads
as one uninterrupted run.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

from .errors import OutcoreError

# compute_s and copy_wait_s come from device events read once they have run: on a GPU
# usually the step before the row's (stream/stats.py); optimizer_wait_s is the row's own.
COLUMNS = ["step", "loss", "lr", "grad_norm", "skipped", "tokens_per_s", "mfu", "step_s",
           "compute_s", "copy_wait_s", "optimizer_wait_s", "host_rss_bytes", "gpu_peak_bytes"]


class RunLog:
    """write(row) with row keys from COLUMNS (and any others: each a new CSV column);
    `step` is 1-based (steps done)."""

    def __init__(self, out_dir: Path, resume_step: int = 0, tensorboard: bool = True):
        out_dir = Path(out_dir)
        self.jsonl = out_dir / "metrics.jsonl"
        self.csv = out_dir / "metrics.csv"
        self._jf = self._cf = None
        self._closed = False
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            self._truncate(resume_step)
            new_csv = not self.csv.exists()
            # line-buffered: each row reaches the file as it is written (tail -f, a crash),
            # not 8 KiB later or only at the next checkpoint's flush
            self._jf = open(self.jsonl, "a", buffering=1)
            self._cf = open(self.csv, "a", newline="", buffering=1)
        except OSError as e:
            for f in (self._jf, self._cf):
                if f is not None:
                    f.close()
            where = e.filename if e.filename is not None else out_dir
            raise OutcoreError(f"cannot write the run log in {out_dir} ({where}: "
                               f"{e.strerror or e}): give a writable output directory, or "
                               "remove what is in the way there") from None
        self._cw = csv.DictWriter(self._cf, fieldnames=self._fields, extrasaction="ignore")
        if new_csv:
            self._cw.writeheader()
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                # purge_step: TensorBoard hides events after the resume step
                self.tb = SummaryWriter(str(out_dir / "tensorboard"),
                                        purge_step=resume_step + 1 if resume_step else None)
            except ImportError:
                print("outcore: tensorboard is not installed, logging JSONL/CSV only "
                      "(pip install tensorboard)", file=sys.stderr)

    def _truncate(self, step: int) -> None:
        # A row that does not parse (a line cut by a crash, a second header) is dropped.
        self._fields = list(COLUMNS)
        if self.jsonl.exists():
            keep = [ln for ln in self.jsonl.read_text().splitlines()
                    if _upto(_json(ln), step)]
            self.jsonl.write_text("".join(ln + "\n" for ln in keep))
        if self.csv.exists():
            with open(self.csv, newline="") as f:
                reader = csv.DictReader(f)
                rows = [r for r in reader if _upto(r, step)]
            # columns a run added (RunLog.write's new keys) stay; other versions' too
            self._fields += [c for c in reader.fieldnames or () if c not in self._fields]
            self._rewrite_csv(rows)

    def _rewrite_csv(self, rows: list[dict]) -> None:
        """metrics.csv as `rows` under self._fields, through a temporary file and a rename
        (a crash leaves the old file or the new one, never half of one)."""
        tmp = self.csv.with_name(self.csv.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            # ignore: the surplus cells of a row longer than the header (DictReader files
            # them under the key None)
            w = csv.DictWriter(f, fieldnames=self._fields, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        tmp.replace(self.csv)

    def write(self, row: dict) -> None:
        # NaN/inf (a skipped step's gradient norm) as null / an empty cell: json.dumps would
        # write NaN, which is not JSON (jq, JavaScript and most readers reject the line).
        row = {k: None if isinstance(v, float) and not math.isfinite(v) else v
               for k, v in row.items()}
        self._jf.write(json.dumps(row) + "\n")
        new = [k for k in row if k not in self._fields]
        if new:
            self._widen(new)
        self._cw.writerow(row)
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and v is not None:
                    self.tb.add_scalar(f"train/{k}", v, row["step"])

    def _widen(self, keys: list[str]) -> None:
        """A key no row had before (a caller's own metric): metrics.csv is rewritten with
        it as a new column, empty in the earlier rows, as the JSONL has it from here on."""
        self._cf.close()
        with open(self.csv, newline="") as f:
            rows = list(csv.DictReader(f))
        self._fields += keys
        self._rewrite_csv(rows)
        self._cf = open(self.csv, "a", newline="", buffering=1)
        self._cw = csv.DictWriter(self._cf, fieldnames=self._fields, extrasaction="ignore")

    def flush(self) -> None:
        if self._closed:
            return
        self._jf.flush()
        self._cf.flush()
        if self.tb is not None:
            self.tb.flush()

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._jf.close()
        self._cf.close()
        if self.tb is not None:
            self.tb.close()


class NoLog:
    """RunLog's interface, writing nothing: the ranks other than 0 of --nproc N."""

    def write(self, row: dict) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _json(line: str) -> dict | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def _upto(row: dict | None, step: int) -> bool:
    """Whether a row's step (1-based) parses and is at most `step`."""
    try:
        return row is not None and int(row["step"]) <= step
    except (KeyError, TypeError, ValueError):
        return False
