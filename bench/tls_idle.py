#!/usr/bin/env python3
"""Opens N TLS streams to a proxy, waits for each stream's first event, holds them open, and prints "ready"
on stdout; exits (closing everything) on SIGTERM/SIGINT or after --hold seconds. Used by bench/tls-idle.sh."""
import argparse, asyncio, signal, ssl, sys

BODY = b'{"threadId":"bench","runId":"r","messages":[{"id":"m1","role":"user","content":"Hello"}]}'


async def one(host, port, path, ctx, ready, conns):
    reader, writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname="localhost")
    conns.append(writer)
    writer.write(b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(BODY), BODY))
    await writer.drain()
    buf = b""
    while b"data: " not in buf:
        chunk = await reader.read(4096)
        if not chunk:
            raise RuntimeError("stream closed before its first event")
        buf += chunk
    ready()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--path", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--hold", type=float, default=120)
    a = ap.parse_args()
    ctx = ssl.create_default_context(cafile=a.ca)
    done = 0
    conns = []

    def ready():
        nonlocal done
        done += 1

    sem = asyncio.Semaphore(200)  # bounded handshakes in flight

    async def guarded():
        async with sem:
            await one("127.0.0.1", a.port, a.path, ctx, ready, conns)

    await asyncio.wait_for(asyncio.gather(*(guarded() for _ in range(a.n))), 120)
    print("ready %d" % done, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    try:
        await asyncio.wait_for(stop.wait(), a.hold)
    except asyncio.TimeoutError:
        pass
    for w in conns:
        w.close()


asyncio.run(main())
