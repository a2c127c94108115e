"""What incidents hangs on other apps' hooks (registered in IncidentsConfig.ready): the
watchdog on each batch of samples nodes stores."""

from __future__ import annotations

from nodes.hooks import SampleBatch

from .services import batch_watch


def watchdog_sample_hook(batch: SampleBatch) -> dict[str, int]:
    """nodes' sample hook (called with the batch): the watchdog's per-batch rules, in the
    telemetry worker right after the batch commits."""
    return batch_watch(batch=batch)
