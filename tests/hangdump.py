"""Where a hung distributed test was: every thread's stack on stderr, which ``_torchrun`` shows when it fails.

``arm()`` in a rank's program dumps its stacks when torchrun stops it (SIGTERM, after another rank failed);
``worker`` (a DataLoader ``worker_init_fn``) dumps a worker's once if it is still running after ``AFTER_S`` seconds.
The rank itself must not arm faulthandler's timer: a forked worker arming it again would wait for ever on the
parent's timer thread, which the fork did not copy.
"""

from __future__ import annotations

import faulthandler
import signal
import sys

AFTER_S = 45.0  # longer than any healthy worker of these tests lives, shorter than their DataLoader timeout (60 s)


def arm() -> None:
    faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=True)


def worker(worker_id: int) -> None:
    faulthandler.dump_traceback_later(AFTER_S, repeat=False, file=sys.stderr, exit=False)
