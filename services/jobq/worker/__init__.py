"""The consumer process, as small units with private state (read
``consumer.py`` first: it names the others and what each promises)."""
