#!/usr/bin/env python3
"""Resident memory of Sluice per connected idle client.

Opens N client connections (trust auth, protocol 3.0 startup, waits for ReadyForQuery)
and keeps them idle; prints Sluice's RSS before and after, and the bytes per client.
  python3 bench/idle_clients.py --pid PID --port PORT --user U --db D [--clients 10000]
Raise `ulimit -n` for this shell first (10,000 clients need 10,000 descriptors here too).
"""
import argparse, asyncio, struct


def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def startup(user: str, db: str) -> bytes:
    body = struct.pack("!I", 3 << 16) + b"user\0" + user.encode() + b"\0database\0" + db.encode() + b"\0\0"
    return struct.pack("!I", len(body) + 4) + body


async def connect(port: int, packet: bytes):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(packet)
    while True:
        head = await reader.readexactly(5)
        body = await reader.readexactly(struct.unpack("!I", head[1:])[0] - 4)
        if head[:1] == b"E":
            raise RuntimeError(body)
        if head[:1] == b"Z":
            return reader, writer


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--user", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--clients", type=int, default=10000)
    a = ap.parse_args()
    packet = startup(a.user, a.db)
    await connect(a.port, packet)  # warm: pool created, server defaults learned
    before = rss_kib(a.pid)
    conns, sem = [], asyncio.Semaphore(200)

    async def one():
        async with sem:
            conns.append(await connect(a.port, packet))

    await asyncio.gather(*(one() for _ in range(a.clients)))
    await asyncio.sleep(1)
    after = rss_kib(a.pid)
    per = (after - before) * 1024 / a.clients
    print(f"clients={a.clients} rss_before={before} KiB rss_after={after} KiB per_client={per:.0f} B")
    for _, w in conns:
        w.close()


asyncio.run(main())
