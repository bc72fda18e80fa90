"""The ``jobq`` verbs, one module per verb or verb group, each holding its
parsers and what they run (``register`` adds its parsers; each sets ``run``).
In the order ``jobq --help`` lists them."""

from jobq.ops.verbs import audit, install, jobs, publishing, queues, reading, schedule, services

GROUPS = (install, services, publishing, schedule, queues, reading, audit, jobs)
