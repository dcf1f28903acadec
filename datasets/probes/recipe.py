#!/usr/bin/env python3
"""The probe recipe (datasets/probes/RECIPE.md, version 1) in Python, for data loaders such as the
probe model's trainer (datasets/models/probe/). It must reproduce datasets/probes/golden.json byte for byte:

    python3 datasets/probes/recipe.py --check datasets/probes/golden.json

Token counts default to bytes + 1 (a byte-level vocabulary with BOS); pass another `count`
callable to make_needle for a different tokenizer. Standard library only.
"""
import json
import math
import sys

RECIPE_VERSION = 1
M64 = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.s = seed & M64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def below(self, n):
        return 0 if n == 0 else self.next() % n


def state0(tag, seed, a):
    return (seed * 0x100000001B3 + a * 0x9E3779B97F4A7C15 + tag) & M64


KEY_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
SERVICES = ["api-gateway", "auth", "billing", "scheduler", "search", "storage", "mailer", "metrics",
            "frontend", "inventory", "payments", "notifier"]
RESOURCES = ["users", "orders", "invoices", "sessions", "items", "reports", "events", "carts"]
USERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
VOLUMES = ["data", "log", "cache", "spool"]
HEADER = "Below is a service log. One line in it holds the secret key.\n"
QUESTION = "Question: What is the secret key?\nAnswer:"


def byte_count(text):
    return len(text.encode("utf-8")) + 1


def timestamp(ms):
    day = 1 + ms // 86400000
    t = ms % 86400000
    return "2024-01-%02dT%02d:%02d:%02d.%03dZ" % (day, t // 3600000, t // 60000 % 60, t // 1000 % 60, t % 1000)


def level_of(r):
    return "INFO " if r < 12 else "DEBUG" if r < 16 else "WARN " if r < 19 else "ERROR"


def message(g):
    t = g.below(12)
    if t == 0:
        v = 1 + g.below(3); res = RESOURCES[g.below(8)]; i = g.below(100000); ms = 1 + g.below(900)
        return "GET /api/v%d/%s/%d 200 in %d ms" % (v, res, i, ms)
    if t == 1:
        v = 1 + g.below(3); res = RESOURCES[g.below(8)]; ms = 1 + g.below(900)
        return "POST /api/v%d/%s 201 in %d ms" % (v, res, ms)
    if t == 2:
        u = USERS[g.below(8)]; b = g.below(256); c = g.below(256); d = g.below(256)
        return "user %s logged in from 10.%d.%d.%d" % (u, b, c, d)
    if t == 3:
        p = g.below(100); q = g.below(10); n = 100 + g.below(99900)
        return "cache hit ratio %d.%d%% over %d requests" % (p, q, n)
    if t == 4:
        m = 8 + g.below(57); n = g.below(m + 1)
        return "connection pool %d/%d in use" % (n, m)
    if t == 5:
        i = g.below(100000); k = 1 + g.below(5)
        return "retrying job %d (attempt %d of 5)" % (i, k)
    if t == 6:
        p = g.below(100); vol = VOLUMES[g.below(4)]
        return "disk usage at %d%% on /var/%s" % (p, vol)
    if t == 7:
        n = 1 + g.below(5000); res = RESOURCES[g.below(8)]; ms = 1 + g.below(900)
        return "flushed %d records to %s in %d ms" % (n, res, ms)
    if t == 8:
        return "health check passed (%d ms)" % (1 + g.below(900))
    if t == 9:
        res = RESOURCES[g.below(8)]; ms = 1000 + g.below(9000)
        return "slow query on %s: %d ms" % (res, ms)
    if t == 10:
        return "worker %d started" % g.below(64)
    return "config reloaded, %d entries" % (1 + g.below(500))


def next_line(g, clock):
    clock[0] += 1 + g.below(4000)
    ts = timestamp(clock[0])
    level = level_of(g.below(20))
    svc = SERVICES[g.below(12)]
    pid = 1000 + g.below(9000)
    return ts, "%s %s %s[%d]: %s\n" % (ts, level, svc, pid, message(g))


def _assemble(lines, n, p, tail):
    s = [HEADER]
    for i in range(n + 1):
        if i == p:
            ts = lines[p][0] if p < n else (lines[n - 1][0] if n > 0 else timestamp(0))
            s.append(ts + tail)
        if i < n:
            s.append(lines[i][1])
    s.append(QUESTION)
    return "".join(s)


def make_needle(length, depth, seed, count=byte_count):
    """Returns dict(prompt, key, haystack_lines, needle_line, prompt_tokens)."""
    g = SplitMix64(state0(1, seed, length))
    key = "".join(KEY_ALPHABET[g.below(32)] for _ in range(8))
    pid = 1000 + g.below(9000)
    tail = " INFO  keystore[%d]: the secret key is %s\n" % (pid, key)
    clock = [g.below(43200) * 1000]
    empty = count("")
    est = count(_assemble([], 0, 0, tail))
    lines = []
    while est <= length and len(lines) < length:
        lines.append(next_line(g, clock))
        est += max(1, count(lines[-1][1]) - empty)
    for _ in range(8):
        lines.append(next_line(g, clock))

    def build(n):
        p = int(math.floor(depth * n + 0.5))
        return _assemble(lines, n, p, tail), p

    n = max(0, len(lines) - 9)
    text, p = build(n)
    tokens = count(text)
    while tokens > length and n > 0:
        n -= 1
        text, p = build(n)
        tokens = count(text)
    while n < len(lines):
        t2, p2 = build(n + 1)
        k2 = count(t2)
        if k2 > length:
            break
        n, text, p, tokens = n + 1, t2, p2, k2
    return {"prompt": text, "key": key, "haystack_lines": n, "needle_line": p, "prompt_tokens": tokens}


def make_counting(n):
    return {"prompt": "Count from 1 to %d:\n" % n, "expected": " ".join(str(i) for i in range(1, n + 1))}


def make_echo(seed, index):
    g = SplitMix64(state0(3, seed, index))
    digits = 1 + g.below(12)
    number = str(1 + g.below(9)) + "".join(str(g.below(10)) for _ in range(digits - 1))
    return {"number": number, "prompt": "Reply with %s and nothing else.\nReply:" % number}


def check(golden_path):
    g = json.load(open(golden_path, encoding="utf-8"))
    assert g["recipe_version"] == RECIPE_VERSION, "recipe version differs"
    bad = 0
    for c in g["needle"]:
        r = make_needle(c["length"], c["depth"], c["seed"])
        for k in ("prompt", "key", "haystack_lines", "needle_line", "prompt_tokens"):
            if r[k] != c[k]:
                bad += 1
                print("needle L=%d d=%s seed=%d: %s differs" % (c["length"], c["depth"], c["seed"], k))
    for c in g["echo"]:
        r = make_echo(c["seed"], c["index"])
        if r["number"] != c["number"] or r["prompt"] != c["prompt"]:
            bad += 1
            print("echo seed=%d index=%d differs" % (c["seed"], c["index"]))
    for c in g["counting"]:
        r = make_counting(c["n"])
        if r["prompt"] != c["prompt"] or r["expected"] != c["expected"]:
            bad += 1
            print("counting n=%d differs" % c["n"])
    total = len(g["needle"]) + len(g["echo"]) + len(g["counting"])
    print("%d passed, %d failed" % (total - bad, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2]))
    print(__doc__)
    sys.exit(2)
