"""A runner stand-in for the supervisor integration tests (stdlib only, starts fast).

Usage: child.py MODE. It dials 127.0.0.1:$CHILD_PORT and says
"hello $CHILD_TOKEN <pid> <grandchild pid or ->", then lives until stdin EOF,
like a real runner (G9). Modes:
  normal     - as above
  crash      - prints a line and exits 3 before saying hello
  stubborn   - ignores SIGTERM and stdin EOF: only SIGKILL ends it
  grandchild - first spawns `sh -c 'sleep 100 & wait'` and reports the sleep's pid
"""

import os
import signal
import socket
import subprocess
import sys

mode = sys.argv[1]
print(f"child {os.getpid()} mode={mode}", flush=True)
if mode == "crash":
    print("boom: cannot start, crashing on purpose", flush=True)
    sys.exit(3)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

grandchild = "-"
if mode == "grandchild":
    sh = subprocess.Popen(["sh", "-c", "sleep 100 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    grandchild = sh.stdout.readline().strip()

with socket.create_connection(("127.0.0.1", int(os.environ["CHILD_PORT"]))) as conn:
    conn.sendall(f"hello {os.environ['CHILD_TOKEN']} {os.getpid()} {grandchild}\n".encode())

sys.stdin.buffer.read()  # returns at EOF: the supervisor is gone or stopping us
print("stdin closed", flush=True)
if mode == "stubborn":
    while True:
        signal.pause()
