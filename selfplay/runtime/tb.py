"""TensorBoard logging for a run: scalars grouped by prefix (docs/architecture.md), text samples, hyperparameters.

Only rank 0 writes (`enabled=False` elsewhere turns every call into a no-op), so multi-rank runs produce one
set of event files in `RUN_DIR/tb/`. Non-finite scalars are skipped rather than poisoning the plots.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from selfplay.runtime.paths import RunPaths

if TYPE_CHECKING:  # imported where a writer is made: torch is slow to import
    from torch.utils.tensorboard import SummaryWriter


class TBLogger:
    def __init__(self, run_dir: str | Path, enabled: bool = True):
        self.enabled = enabled
        self.writer: SummaryWriter | None = None  # rank 0's; None where disabled
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(RunPaths(run_dir).tb))

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        if self.writer is None:
            return
        for tag, value in values.items():
            value = float(value)
            if math.isfinite(value):
                self.writer.add_scalar(tag, value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        if self.writer is not None:
            # TensorBoard renders markdown: keep code readable in a fenced block
            self.writer.add_text(tag, text, step)

    def hparams(self, flat_config: Mapping[str, object]) -> None:
        """Record the run's configuration as TensorBoard text (searchable), one `key = value` line each."""
        if self.writer is not None:
            lines = [f"    {k} = {v}" for k, v in sorted(flat_config.items())]
            self.writer.add_text("config", "\n".join(lines), 0)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """All scalar series of a run's event files: tag -> [(step, value)], for tests, eval plots and reports."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(RunPaths(run_dir).tb), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
