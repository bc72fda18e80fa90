"""The reaper: any number of symmetric peers that bring back jobs nobody is
running and publish what nobody published. One file per duty, as a sweep
runs them (each fails alone):

- ``rescue.py``     cut the leases of vanished workers; requeue (or fail as a
                    job of death) leases that lapsed, charging only on evidence
- ``periodic.py``   fire due schedule slots, once per slot
- ``unpark.py``     release jobs a queue's limit parked, as slots free
- ``relay.py``      (top level: the producer and the worker publish the same
                    way) publish due rows nobody is known to have published
- ``lost.py``       every ``lost_check_s``: ids the broker lost, back to the relay
- ``retention.py``  every ``prune_every_s``: finished jobs past their retention

``service.py`` is the loop around them: connect, sweep, sleep until the next
deadline or a NOTIFY, record the sweep, readiness.
"""

from jobq.reaper.service import DUTIES, IDLE_IN_TX_S, Reaper, Sweep

__all__ = ["DUTIES", "IDLE_IN_TX_S", "Reaper", "Sweep"]
