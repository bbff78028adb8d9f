"""Job and run ids: time first, so that they sort by creation, then random bits."""

from __future__ import annotations

import os
import time

# Random bits in an id, after its millisecond. Ids made in the same millisecond (an
# `enqueue_many` makes some 70 job ids in one here; machines sharing a database add theirs)
# differ only there, and a job whose id is taken is the one already there: the new one would be
# lost. With 32 bits, a batch of 10,000 lost a job once in some 13,000 batches; with 56 it takes
# some 300 million ids in one millisecond to reach even odds of one collision. (56, not 64: two
# ids still fit one line of the console at 80 columns.)
ID_RANDOM_BYTES = 7


def new_id(prefix: str) -> str:
    # Time first so ids sort by creation, then randomness: the operating system's, which is
    # what `secrets.token_hex` reads too, through three calls of its own (two ids a job).
    return f"{prefix}_{int(time.time() * 1000):011x}{os.urandom(ID_RANDOM_BYTES).hex()}"
