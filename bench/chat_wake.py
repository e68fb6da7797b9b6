#!/usr/bin/env python3
"""Send-to-wake latency of chat long-polls (issue 9), with plain asyncio HTTP/1.1 (no extra
packages): N pollers each hold `GET /api/chat/channels/{id}/messages/?wait=30` on their own
channel; once all wait, one message is sent to each channel in turn (PACE_MS apart), and each
poller's latency is the time from just before its channel's send to its response.

usage: chat_wake.py HOST PORT CHANNELS_TSV (lines: channel_id<TAB>poller_token<TAB>sender_token)
prints: RESULT pollers=N p50=.. p90=.. p99=.. max=.. (ms) timeouts=K
"""
import asyncio
import json
import sys
import time

HOST, PORT, FILE = sys.argv[1], int(sys.argv[2]), sys.argv[3]
PACE_MS = float(sys.argv[4]) if len(sys.argv) > 4 else 2.0


async def request(method, path, token, body=None):
    reader, writer = await asyncio.open_connection(HOST, PORT)
    data = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    writer.write(head.encode() + data)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    status = int(raw.split(b" ", 2)[1])
    return status, raw.split(b"\r\n\r\n", 1)[1]


async def main():
    rows = [line.rstrip("\n").split("\t") for line in open(FILE) if line.strip()]
    sent_at = {}
    latencies = []
    timeouts = 0
    ready = asyncio.Event()
    waiting = 0

    async def poll(channel, token):
        nonlocal timeouts, waiting
        reader, writer = await asyncio.open_connection(HOST, PORT)
        head = (f"GET /api/chat/channels/{channel}/messages/?since_id=0&wait=30 HTTP/1.1\r\n"
                f"Host: {HOST}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n")
        writer.write(head.encode())
        await writer.drain()
        waiting += 1
        if waiting == len(rows):
            ready.set()
        raw = await reader.read()
        done = time.perf_counter()
        writer.close()
        body = json.loads(raw.split(b"\r\n\r\n", 1)[1] or b"{}")
        if body.get("messages") and channel in sent_at:
            latencies.append((done - sent_at[channel]) * 1000)
        else:
            timeouts += 1

    pollers = [asyncio.create_task(poll(c, p)) for c, p, _ in rows]
    await ready.wait()
    await asyncio.sleep(2.0)  # every poll has reached the server and waits
    for channel, _, sender in rows:
        sent_at[channel] = time.perf_counter()
        status, _ = await request("POST", f"/api/chat/channels/{channel}/messages/", sender,
                                  {"content": "wake up"})
        assert status == 201, status
        await asyncio.sleep(PACE_MS / 1000)
    await asyncio.gather(*pollers)
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]
    print(f"RESULT pollers={len(rows)} p50={pick(0.5):.2f} p90={pick(0.9):.2f} "
          f"p99={pick(0.99):.2f} max={latencies[-1]:.2f} timeouts={timeouts}")


asyncio.run(main())
