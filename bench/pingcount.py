"""The completion counter every system's handler reports to (one UDP
datagram per finished job), so all systems are timed the same way:
    python pingcount.py PORT N TIMEOUT_S
prints "ready", then "first" at the first ping, then {"first": t, "last":
t, "count": k} (time.time()) when N pings came,
or when TIMEOUT_S passed without one. Runs in its own process so that
counting never competes with a producer for a GIL."""
import json
import socket
import sys
import time

port, n, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind(("127.0.0.1", port))
s.settimeout(timeout)
print("ready", flush=True)
first = last = 0.0
count = 0
try:
    while count < n:
        s.recv(64)
        last = time.time()
        if not first:
            first = last
            print("first", flush=True)
        count += 1
except TimeoutError:
    pass
print(json.dumps({"first": first, "last": last, "count": count}), flush=True)
