#!/usr/bin/env python3
"""Seed chirp through its HTTP API: 200 users, 20 random follows each, 10 tweets each.
Usage: seed.py PORT TOKENS_OUT. Same random seed (42) for every run, so A and B get the same graph."""
import http.client, json, random, sys, time

port, out = int(sys.argv[1]), sys.argv[2]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

def call(method, path, body=None, token=None, want=(200, 201)):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = conn.getresponse()
    data = r.read()
    if r.status not in want:
        raise SystemExit(f"{method} {path}: {r.status} {data[:300]!r}")
    return json.loads(data) if data else None

t0 = time.time()
users = []  # (id, token)
for i in range(200):
    r = call("POST", "/api/accounts/signup/",
             {"username": f"abuser{i:03d}", "email": f"abuser{i:03d}@example.com", "password": "benchpass123"})
    users.append((r["user"]["id"], r["token"]))
t1 = time.time()
rng = random.Random(42)
follows = 0
for idx, (uid, tok) in enumerate(users):
    others = [u for j, u in enumerate(users) if j != idx]
    for fid, _ in rng.sample(others, 20):
        r = call("POST", f"/api/friendships/{fid}/follow/", token=tok, want=(201,))
        if r.get("duplicate"):
            raise SystemExit("unexpected duplicate follow")
        follows += 1
t2 = time.time()
tweets = 0
for k in range(10):
    for i, (uid, tok) in enumerate(users):
        call("POST", "/api/tweets/", {"content": f"seed tweet {k} by abuser{i:03d}"}, token=tok, want=(201,))
        tweets += 1
t3 = time.time()
with open(out, "w") as f:
    for _, tok in users:
        f.write(tok + "\n")
print(f"seeded users=200 follows={follows} tweets={tweets} signup_s={t1-t0:.1f} follow_s={t2-t1:.1f} tweet_s={t3-t2:.1f}")
