#!/usr/bin/env python3
"""The table and the goals of bench/run.sh, from its raw JSON lines (one per load run).

Every figure is a median over the rounds of one run of the script; every ratio compares medians of
that same run. "Best peer" is the better of nginx and HAProxy for the metric at hand (the lower CPU,
latency, time or memory; the higher rate). See doc/benchmarks.md.
"""
import argparse
import json
import statistics

SCENARIOS = ["short", "short-new", "throughput", "paced", "paced2k", "idle2k", "idle10k"]
TARGETS = ["direct", "nginx", "haproxy", "gateway"]
PEERS = ["nginx", "haproxy"]
NAMES = {"direct": "direct", "nginx": "nginx", "haproxy": "HAProxy", "gateway": "gateway"}
RSS_GOAL_KIB = 8.0


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def cpu_per_mev(r):
    c, e = r.get("proxy_cpu_s"), r["load"].get("events", 0)
    return c / e * 1e6 if c is not None and e else None


def cpu_per_krun(r):
    c, n = r.get("proxy_cpu_s"), r["load"].get("runs_ok", 0)
    return c * 1e3 / n * 1e3 if c is not None and n else None


def lo(key, q):
    return lambda r: r["load"].get(key, {}).get(q) or None


METRICS = {
    # name: (function of a record, decimals, better)
    "events/s": (lambda r: r["load"].get("events_per_s"), 0, "higher"),
    "runs/s": (lambda r: r["load"].get("runs_per_s"), 0, "higher"),
    "TTFE p50 (µs)": (lo("ttfe_us", "p50"), 0, "lower"),
    "TTFE p99 (µs)": (lo("ttfe_us", "p99"), 0, "lower"),
    "latency p50 (µs)": (lo("latency_us", "p50"), 0, "lower"),
    "latency p99 (µs)": (lo("latency_us", "p99"), 0, "lower"),
    "proxy CPU s / M events": (cpu_per_mev, 2, "lower"),
    "proxy CPU ms / 1000 runs": (cpu_per_krun, 1, "lower"),
    "streams held": (lambda r: r["load"].get("held"), 0, ""),
    "streams": (lambda r: r["load"].get("concurrency"), 0, ""),
    "RSS before (KiB)": (lambda r: r.get("rss_before_kib"), 0, ""),
    "RSS with streams open (KiB)": (lambda r: r.get("rss_after_kib"), 0, ""),
    "KiB per open stream": (lambda r: r.get("kib_per_stream"), 2, "lower"),
}

ROWS = {
    "short": ["events/s", "runs/s", "TTFE p50 (µs)", "TTFE p99 (µs)", "proxy CPU s / M events",
              "proxy CPU ms / 1000 runs"],
    "throughput": ["events/s", "TTFE p50 (µs)", "TTFE p99 (µs)", "proxy CPU s / M events"],
    "paced": ["events/s", "TTFE p50 (µs)", "TTFE p99 (µs)", "latency p50 (µs)", "latency p99 (µs)",
              "proxy CPU s / M events"],
    "idle": ["streams held", "TTFE p50 (µs)", "TTFE p99 (µs)", "RSS before (KiB)",
             "RSS with streams open (KiB)", "KiB per open stream"],
}
ROWS["short-new"] = ROWS["short"]
ROWS["paced2k"] = ROWS["paced"]
ROWS["idle2k"] = ROWS["idle10k"] = ROWS["idle"]


class Run:
    def __init__(self, recs):
        self.recs = recs
        self.targets = [t for t in TARGETS if any(r["target"] == t for r in recs)]
        self.scenarios = [s for s in SCENARIOS if any(r["scenario"] == s for r in recs)]
        self.peers = [t for t in PEERS if t in self.targets]

    def values(self, s, t, metric):
        f = METRICS[metric][0]
        return [v for v in (f(r) for r in self.recs if r["scenario"] == s and r["target"] == t)
                if v is not None]

    def med(self, s, t, metric):
        v = self.values(s, t, metric)
        return statistics.median(v) if v else None

    def best_peer(self, s, metric):
        """(target, median) of the better peer, or (None, None)."""
        better = METRICS[metric][2]
        vals = [(t, self.med(s, t, metric)) for t in self.peers]
        vals = [(t, v) for t, v in vals if v is not None]
        if not vals:
            return None, None
        pick = max if better == "higher" else min
        return pick(vals, key=lambda tv: tv[1])

    def per_round(self, s, t, metric):
        f = METRICS[metric][0]
        return {r["round"]: f(r) for r in self.recs if r["scenario"] == s and r["target"] == t}

    def failures(self, s, t):
        rs = [r for r in self.recs if r["scenario"] == s and r["target"] == t]
        failed = sum(r["load"].get("runs_failed", 0) for r in rs)
        bad = sum(1 for r in rs if r["exit"] != 0)
        return failed, bad


def fmt(v, nd=0):
    if v is None:
        return "n/a"
    return f"{v:,.{nd}f}"


def main():
    ap = argparse.ArgumentParser()
    for a in ("raw", "rounds", "seconds", "quick", "cpus", "pinned", "nginx", "haproxy", "batched",
              "workers", "nofile"):
        ap.add_argument("--" + a, default="")
    a = ap.parse_args()
    run = Run(load(a.raw))
    out = []
    pinned = a.pinned not in ("", "0")
    out.append(
        f"Medians of {a.rounds} round(s) of {a.seconds} s{' (--quick)' if a.quick == '1' else ''}, "
        f"targets alternating; {a.cpus} CPUs"
        f"{' (proxy pinned to CPU 1, load generator and agent to CPU 0)' if pinned else ' (not pinned)'}; "
        f"nginx {a.nginx} ({a.workers} worker), HAProxy {a.haproxy} ({a.workers} thread), gateway "
        f"({a.workers} worker loop, bearer auth on); the demo agent writes "
        f"{'as many events per write as it has (--batched)' if a.batched == '1' else 'each event in its own chunk and write()'}; "
        "proxy CPU = on-CPU time of the proxy's threads (nginx: its worker), from /proc/PID/task/*/sched; "
        "best peer = the better of nginx and HAProxy; ratio = gateway / best peer.\n")
    hdr = ["scenario", "metric"] + [NAMES[t] for t in run.targets]
    if "gateway" in run.targets and run.peers:
        hdr += ["gateway / best peer", "better"]
    out.append("| " + " | ".join(hdr) + " |")
    out.append("|" + "|".join(["---"] * len(hdr)) + "|")
    for s in run.scenarios:
        fail = [run.failures(s, t) for t in run.targets]
        row = [s, "runs failed (sum); load runs not clean"] + [f"{f}; {b}" for f, b in fail]
        if len(hdr) > len(row):
            row += ["", ""]
        out.append("| " + " | ".join(row) + " |")
        for m in ROWS[s]:
            nd, better = METRICS[m][1], METRICS[m][2]
            row = [s, m] + [fmt(run.med(s, t, m), nd) for t in run.targets]
            if len(hdr) > len(row):
                g = run.med(s, "gateway", m)
                bt, bv = run.best_peer(s, m)
                if better and g is not None and bv:
                    row += [f"{g / bv:.2f} ({NAMES[bt]})", better]
                else:
                    row += ["", better]
            out.append("| " + " | ".join(row) + " |")

    # the shape: one line per scenario, the figures users compare
    out.append("\nIn short (medians; proxy CPU seconds per million events relayed):\n")
    cols = [t for t in ("gateway", "nginx", "haproxy", "direct") if t in run.targets]
    out.append("| scenario | " + " | ".join(NAMES[t] for t in cols) + " |")
    out.append("|---|" + "|".join("---" for _ in cols) + "|")
    label = {
        "short": "short runs, client keep-alive: CPU",
        "short-new": "short runs, a new client connection per run: CPU",
        "throughput": "throughput: CPU",
        "paced": "paced, 1 event/ms: CPU; p99 per-event latency",
        "paced2k": "paced2k (events 20 ms apart): CPU; TTFE p50",
        "idle2k": "idle2k: RSS per open stream; TTFE p50",
        "idle10k": "idle10k: RSS per open stream; TTFE p50",
    }
    for s in run.scenarios:
        cells = []
        for t in cols:
            cpu = run.med(s, t, "proxy CPU s / M events")
            if s.startswith("idle"):
                k = run.med(s, t, "KiB per open stream")
                tt = run.med(s, t, "TTFE p50 (µs)")
                cells.append(f"{fmt(k, 1)} KiB; {fmt(tt / 1000 if tt else None, 1)} ms"
                             if t != "direct" else f"—; {fmt(tt / 1000 if tt else None, 1)} ms")
            elif s == "paced":
                p = run.med(s, t, "latency p99 (µs)")
                cells.append(f"{fmt(cpu, 2)}; {fmt(p / 1000 if p else None, 2)} ms")
            elif s == "paced2k":
                tt = run.med(s, t, "TTFE p50 (µs)")
                cells.append(f"{fmt(cpu, 2)}; {fmt(tt / 1000 if tt else None, 1)} ms")
            else:
                cells.append(fmt(cpu, 2))
        name = label[s]
        if s.startswith("idle") or s == "paced2k":
            n = run.med(s, cols[0], "streams")
            name = name.replace(s, f"{s} ({fmt(n)} streams)", 1)
        out.append(f"| {name} | " + " | ".join(cells) + " |")

    # goals
    out.append("\nGoals (medians of this run; margin = how far under the goal, negative = over it):")

    def verdict(what, value, goal, unit, nd, rounds=None):
        if value is None or goal is None:
            out.append(f"- {what}: n/a (a figure is missing)")
            return
        margin = (goal - value) / goal * 100 if goal else float("-inf")
        ok = value <= goal
        line = (f"- {what}: gateway {value:,.{nd}f}{unit}, goal <= {goal:,.{nd}f}{unit}: "
                f"{'MET' if ok else 'MISSED'} (margin {margin:+.0f} %"
                f"{'' if ok else f'; {value / goal:.2f}x the goal'})")
        if rounds:
            line += f"; per round, gateway / reference: {rounds}"
        out.append(line)

    def round_ratios(s, metric, ref_t, factor=1.0):
        g = run.per_round(s, "gateway", metric)
        ref = run.per_round(s, ref_t, metric) if ref_t else {}
        rr = [f"{g[k] / (ref[k] * factor):.2f}" for k in sorted(g)
              if g[k] is not None and ref.get(k)]
        return ", ".join(rr)

    if "gateway" in run.targets:
        cpu = "proxy CPU s / M events"
        for s in ("short", "throughput"):
            if s in run.scenarios and "haproxy" in run.targets:
                h = run.med(s, "haproxy", cpu)
                verdict(f"{s}: CPU per million events <= HAProxy's / 1.2", run.med(s, "gateway", cpu),
                        h / 1.2 if h else None, " s", 2, round_ratios(s, cpu, "haproxy", 1 / 1.2))
        for s in ("short-new", "paced", "paced2k"):
            if s in run.scenarios and run.peers:
                bt, bv = run.best_peer(s, cpu)
                verdict(f"{s}: CPU per million events <= the best peer's ({NAMES.get(bt, '?')})",
                        run.med(s, "gateway", cpu), bv, " s", 2, round_ratios(s, cpu, bt))
        if "paced" in run.scenarios and run.peers:
            m = "latency p99 (µs)"
            bt, bv = run.best_peer("paced", m)
            verdict(f"paced: p99 per-event latency <= the best peer's ({NAMES.get(bt, '?')})",
                    run.med("paced", "gateway", m), bv, " µs", 0, round_ratios("paced", m, bt))
        for s in ("idle2k", "idle10k"):
            if s in run.scenarios:
                verdict(f"{s}: RSS per open stream <= {RSS_GOAL_KIB:.0f} KiB",
                        run.med(s, "gateway", "KiB per open stream"), RSS_GOAL_KIB, " KiB", 2)
        for s in ("paced2k", "idle2k"):
            if s in run.scenarios and run.peers:
                m = "TTFE p50 (µs)"
                bt, bv = run.best_peer(s, m)
                n = run.med(s, "gateway", "streams")
                verdict(f"{s}: time to first event p50 with {fmt(n)} streams <= the best peer's "
                        f"({NAMES.get(bt, '?')})", run.med(s, "gateway", m), bv, " µs", 0,
                        round_ratios(s, m, bt))
    print("\n".join(out))


if __name__ == "__main__":
    main()
