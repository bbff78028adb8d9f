"""A text sparkline for a table cell: recent throughput at a glance, one glyph per bucket."""

from __future__ import annotations

from collections.abc import Sequence

BARS = " ▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 20, bucket: int = 1) -> str:
    """The last `width * bucket` values, each glyph the peak of `bucket` values; right-aligned
    so that a queue that just started fills in from the right like a strip chart."""
    buckets: list[float] = []
    recent = list(values)[-(width * bucket) :]
    # Group from the newest end so the newest bucket is always complete.
    while recent:
        chunk, recent = recent[-bucket:], recent[:-bucket]
        buckets.append(max(chunk))
    buckets.reverse()
    top = max(buckets, default=0.0)
    if top <= 0:
        glyphs = "▁" * len(buckets)
    else:
        glyphs = "".join(
            BARS[max(1, round(v / top * (len(BARS) - 1)))] if v > 0 else "▁" for v in buckets
        )
    # A flat baseline before the first samples, so the cell reads "nothing yet", not "blank".
    return glyphs.rjust(width, "▁")
