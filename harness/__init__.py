"""What the tests and the benchmarks share, so neither imports the other:
real-process drivers and database handles (``helpers``), the handlers they
run (``apps``), scratch databases and namespaces (``scratch``), and the soak
scenario (``soak``) that the suite runs short and ``bench/soak.py`` long."""
