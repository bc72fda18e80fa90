"""The reaper: any number of symmetric peers that bring back jobs nobody is
running and publish what nobody published.

- ``duties.py``     a sweep's duties, as a table, in their order (each fails
                    alone): cut, requeue (``rescue.py``), schedules
                    (``periodic.py``), unpark, dependants (``dependants.py``),
                    relay
- ``lost.py``       every ``lost_check_s``: ids the broker lost, back to the relay
- ``retention.py``  every ``prune_every_s``: finished jobs past their retention
- ``store.py``      what they need of the database and the broker (a Protocol
                    and the real one; the duties' unit tests use a fake)
- ``wakes.py``      when a reaper wakes: deadlines it knows, NOTIFYs, idle sleep

``service.py`` is the loop around them: connect, sweep, sleep until the next
deadline or a NOTIFY, record the sweep, readiness.
"""

from jobq.reaper.service import DUTIES, IDLE_IN_TX_S, Reaper, Sweep

__all__ = ["DUTIES", "IDLE_IN_TX_S", "Reaper", "Sweep"]
