#!/usr/bin/env python3
"""The table and the goals of bench/run.sh, from its raw JSON lines (one per load run).

Every figure is a median over the rounds of one run of the script; every ratio compares medians of
that same run. "Best peer" is the better of nginx and HAProxy for the metric at hand (the lower CPU,
latency, time or memory; the higher rate). With gateway (history on) and gateway-nohist in the same
run, the history cost is the ratio of their CPU per event, minus 1. Lines of scenario "stall" are the
loop-stall pass (--stall): the longest event-loop lateness under load, with history on and off. See
doc/benchmarks.md.
"""
import argparse
import json
import statistics

SCENARIOS = ["short", "short-new", "throughput", "paced", "paced2k", "idle2k", "idle10k"]
TARGETS = ["direct", "nginx", "haproxy", "gateway", "gateway-nohist"]
PEERS = ["nginx", "haproxy"]
NAMES = {"direct": "direct", "nginx": "nginx", "haproxy": "HAProxy", "gateway": "gateway",
         "gateway-nohist": "gateway, history off"}
RSS_GOAL_KIB = 8.0
HISTORY_COST_GOAL = 10.0  # % more CPU per event with history on than off
STALL_GOAL_MS = 5.0  # the event loop's longest lateness under a recording load


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def cpu_per_mev(r):
    c, e = r.get("proxy_cpu_s"), r["load"].get("events", 0)
    return c / e * 1e6 if c is not None and e else None


def main_per_mev(r):
    c, e = r.get("proxy_main_thread_cpu_s"), r["load"].get("events", 0)
    return c / e * 1e6 if c is not None and e else None


def others_per_mev(r):
    c, m, e = r.get("proxy_cpu_s"), r.get("proxy_main_thread_cpu_s"), r["load"].get("events", 0)
    return (c - m) / e * 1e6 if c is not None and m is not None and e else None


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
    "main thread CPU s / M events": (main_per_mev, 2, "lower"),
    "other threads CPU s / M events": (others_per_mev, 2, "lower"),
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
        self.stall = [r for r in recs if r["scenario"] == "stall"]
        recs = [r for r in recs if r["scenario"] != "stall"]
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
              "workers", "nofile", "store-fs", "writer-apart"):
        ap.add_argument("--" + a, default="")
    a = ap.parse_args()
    run = Run(load(a.raw))
    out = []
    pinned = a.pinned not in ("", "0")
    if "gateway-nohist" in run.targets:
        NAMES["gateway"] = "gateway, history on"
    hist = ""
    if "gateway" in run.targets or run.stall:
        fs = f", on {a.store_fs}" if a.store_fs else ""
        hist = f"the gateway records thread history (an SQLite store in the temporary directory{fs}, fresh at each start"
        hist += ("; its writer thread on CPU 0 with the load generator and the agent, --writer-apart); "
                 if a.writer_apart == "1" else "; its writer thread shares the gateway's CPU); ")
        if "gateway-nohist" in run.targets:
            hist += "gateway, history off: the same gateway with history.enabled false; "
    out.append(
        f"Medians of {a.rounds} round(s) of {a.seconds} s{' (--quick)' if a.quick == '1' else ''}, "
        f"targets alternating; {a.cpus} CPUs"
        f"{' (proxy pinned to CPU 1, load generator and agent to CPU 0)' if pinned else ' (not pinned)'}; "
        f"nginx {a.nginx} ({a.workers} worker), HAProxy {a.haproxy} ({a.workers} thread), gateway "
        f"({a.workers} worker loop, bearer auth on); the demo agent writes "
        f"{'as many events per write as it has (--batched)' if a.batched == '1' else 'each event in its own chunk and write()'}; "
        f"{hist}"
        "proxy CPU = on-CPU time of the proxy's threads (nginx: its worker), from /proc/PID/task/*/sched; "
        "best peer = the better of nginx and HAProxy; ratio = gateway / best peer.\n")
    if run.scenarios:
        table(run, out)
    history_cost(run, out, a.workers)
    stall(run, out)
    print("\n".join(out))


def table(run, out):
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
    cols = [t for t in ("gateway", "gateway-nohist", "nginx", "haproxy", "direct") if t in run.targets]
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


def history_cost(run, out, workers):
    """CPU per event with history on (gateway) against off (gateway-nohist), same run."""
    if "gateway" not in run.targets or "gateway-nohist" not in run.targets:
        return
    cpu = "proxy CPU s / M events"
    rows = []
    for s in run.scenarios:
        on, off = run.med(s, "gateway", cpu), run.med(s, "gateway-nohist", cpu)
        if on is None or not off:
            continue
        g, n = run.per_round(s, "gateway", cpu), run.per_round(s, "gateway-nohist", cpu)
        rr = ", ".join(f"{(g[k] / n[k] - 1) * 100:+.1f}" for k in sorted(g)
                       if g[k] is not None and n.get(k))
        cost = (on / off - 1) * 100
        ok = cost <= HISTORY_COST_GOAL
        loop_on = run.med(s, "gateway", "main thread CPU s / M events")
        loop_off = run.med(s, "gateway-nohist", "main thread CPU s / M events")
        writer = run.med(s, "gateway", "other threads CPU s / M events")
        evs_on, evs_off = run.med(s, "gateway", "events/s"), run.med(s, "gateway-nohist", "events/s")
        per_cpu = (off / on - 1) * 100  # events per CPU-second, the issue's own terms
        rows.append(f"| {s} | {on:,.2f} | {off:,.2f} | {cost:+.1f} % | {per_cpu:+.1f} % | "
                    f"{'MET' if ok else 'MISSED'} | {rr} | "
                    f"{fmt(loop_on, 2)} / {fmt(loop_off, 2)} | {fmt(writer, 2)} | "
                    f"{fmt(evs_on)} / {fmt(evs_off)} |")
    if not rows:
        return
    split = (" with one worker loop, the main thread is the loop and the other thread the store's writer"
             if workers == "1" else " with several worker loops, the other threads are loops and the writer")
    out.append(f"\nHistory cost (proxy CPU s / M events, medians; cost = with / without − 1, goal <= "
               f"{HISTORY_COST_GOAL:.0f} % of CPU per event, the stricter reading of issue 14's \"at most "
               f"10 % of events per CPU-second\", whose own figure is the next column;{split}):\n")
    out.append("| scenario | history on | history off | cost | events per CPU-second | goal <= "
               f"{HISTORY_COST_GOAL:.0f} % | per round (%) | main thread, on / off | other threads, on | "
               "events/s, on / off |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    out.extend(rows)


def in_window(r, key):
    """The latenesses probe <key> kept within the load's window of record <r>: [at, late, own, running]."""
    w = r.get("load_window")
    if not w or key not in r:
        return None
    return [x for x in r[key] if w[0] <= x[0] - x[1] / 1e3 and x[0] <= w[1] + 0.001]


def probe_max(r, key, parts=3):
    xs = in_window(r, key)
    if xs is None:
        return "n/a"
    if not xs:
        return "< 1"
    return " / ".join(fmt(max(x[i] for x in xs), 2) for i in range(1, 1 + parts))


def unshared(r):
    """The longest own part of a gateway lateness under load less what the reference's latenesses
    overlapping it (intervals [at - late, at]) had of their own part: the machine's pauses, which
    a bare loop sees too (the rest of a reference's lateness is its wait for the CPU, which the
    gateway may have held: not counted)."""
    g, ref = in_window(r, "probe_gateway"), r.get("probe_reference")
    if g is None or ref is None:
        return None
    best = 0.0
    for at, late, own, _ in g:
        lo, hi = at - late / 1e3, at
        shared = 0.0
        for rat, rlate, rown, _ in ref:
            shared += min(max(0.0, min(hi, rat) - max(lo, rat - rlate / 1e3)), rown / 1e3)
        best = max(best, own - min(shared * 1e3, own))
    return best


def stall(run, out):
    """The loop-stall pass: the longest lateness of a 1 ms probe timer under the short and the
    throughput load at once, with history on and off."""
    if not run.stall:
        return
    ms = lambda r: (r["metrics"]["agw_event_loop_lag_seconds_max"] * 1e3
                    if "agw_event_loop_lag_seconds_max" in r["metrics"] else None)
    out.append(f"\nLoop stall (the short and the throughput load at once, {len({r['round'] for r in run.stall})} "
               "round(s), a fresh gateway each, AGW_LOOP_PROBE_MS=1: the longest lateness of a 1 ms "
               "timer of the highest priority; no CPU figures from this pass):\n")
    cols = [t for t in ("gateway", "gateway-nohist") if any(r["target"] == t for r in run.stall)]
    out.append("| | " + " | ".join("history on" if t == "gateway" else "history off" for t in cols) + " |")
    out.append("|---|" + "|".join("---" for _ in cols) + "|")

    def recs(t):
        return sorted((r for r in run.stall if r["target"] == t), key=lambda r: r["round"])

    def row(name, f):
        out.append(f"| {name} | " + " | ".join(f(recs(t)) for t in cols) + " |")

    def per_round(rs, f, nd):
        v = [f(r) for r in rs]
        return ", ".join(fmt(x, nd) for x in v)

    def total(rs, f, nd, agg=max):
        v = [x for x in (f(r) for r in rs) if x is not None]
        return fmt(agg(v), nd) if v else "n/a"

    m = lambda k, scale=1.0: (lambda r: r["metrics"][k] * scale if k in r["metrics"] else None)
    sio = lambda who, i: (lambda r: r["storage_io"][who][i] if who in r.get("storage_io", {}) else None)
    idle = lambda r: r["lag_idle_s"] * 1e3 if r.get("lag_idle_s") is not None else None
    row("loop lag max, idle gateway before the load, ms (per round)", lambda rs: per_round(rs, idle, 2))
    row("loop lag max, idle and under load, ms (per round)", lambda rs: per_round(rs, ms, 2))
    row("loop lag max, ms (all rounds)", lambda rs: total(rs, ms, 2))
    # the same less the time the loop thread waited for a CPU meanwhile (its run-queue wait in
    # /proc/thread-self/schedstat): what the loop itself spent, in its callbacks or asleep in a call
    own = m("agw_event_loop_self_lag_seconds_max", 1e3)
    own_idle = lambda r: r["lag_self_idle_s"] * 1e3 if r.get("lag_self_idle_s") is not None else None
    row("the same less the loop's waits for a CPU: idle, ms (per round)", lambda rs: per_round(rs, own_idle, 2))
    row("the same less the loop's waits for a CPU: idle and under load, ms (per round)",
        lambda rs: per_round(rs, own, 2))
    # of that own part, the most the loop can have spent running (its time on a CPU since the expiry
    # it served before): its callbacks; the rest it slept (woken late in epoll_wait() or a nap, a
    # lock, a disk wait: the loop's storage I/O below tells the last apart)
    busy = m("agw_event_loop_busy_lag_seconds_max", 1e3)
    busy_idle = lambda r: r["lag_busy_idle_s"] * 1e3 if r.get("lag_busy_idle_s") is not None else None
    row("of that, the loop running its own work (an upper bound): idle, ms (per round)",
        lambda rs: per_round(rs, busy_idle, 2))
    row("of that, the loop running its own work (an upper bound): idle and under load, ms (per round)",
        lambda rs: per_round(rs, busy, 2))
    row("when it grew under load: s into the load → ms (per round)",
        lambda rs: "; ".join(" ".join(f"{t:.1f}→{v * 1e3:.1f}" for t, v in r.get("lag_steps", [])) or "—"
                             for r in rs))
    # both probes' latenesses of 1 ms or more with their times (the gateway's and the bare loop's
    # beside it on the same CPU): exact maxima over the load's window, and the gateway's own part
    # less the time the reference was late too (the machine's pauses, which no loop can avoid)
    row("under load only (the latenesses each probe kept): longest lateness / own / running, ms (per round)",
        lambda rs: "; ".join(probe_max(r, "probe_gateway") for r in rs))
    row("the reference beside it (a bare loop on the same CPU), same window: longest lateness / own, ms (per round)",
        lambda rs: "; ".join(probe_max(r, "probe_reference", 2) for r in rs))
    row("the gateway loop's own part under load less the reference's own part at the same moments, longest, ms (per round)",
        lambda rs: per_round(rs, unshared, 2))
    row("events relayed (throughput + short, per round)",
        lambda rs: per_round(rs, lambda r: r["load"].get("events", 0) + r["load_short"].get("events", 0), 0))
    row("runs failed; load runs not clean",
        lambda rs: f"{sum(r['load'].get('runs_failed', 0) + r['load_short'].get('runs_failed', 0) for r in rs)}; "
                   f"{sum(1 for r in rs if r['exit'] != 0)}")
    for k, name, scale, nd, agg in (
            ("agw_history_records_total", "history records (sum)", 1, 0, sum),
            ("agw_history_dropped_total", "history records dropped (sum)", 1, 0, sum),
            ("agw_history_malformed_total", "history records malformed (sum)", 1, 0, sum),
            ("agw_history_commits_total", "store commits (sum)", 1, 0, sum),
            ("agw_history_commit_errors_total", "store commit errors (sum)", 1, 0, sum),
            ("agw_history_commit_seconds_max", "longest commit, ms (max)", 1e3, 1, max),
            ("agw_history_queue_bytes", "writer queue at the end, bytes (max)", 1, 0, max),
            ("agw_history_cached_threads", "threads cached at the end (max)", 1, 0, max)):
        row(name, lambda rs, k=k, scale=scale, nd=nd, agg=agg: total(rs, m(k, scale), nd, agg))
    # the kernel's storage accounting per thread over the load: the loop must do no file I/O at all
    row("event loops (every thread but agw-store): bytes read from / written to storage during the load (per round)",
        lambda rs: "; ".join(f"{fmt(sio('loop', 0)(r), 0)} / {fmt(sio('loop', 1)(r), 0)}"
                             if sio("loop", 0)(r) is not None else "n/a" for r in rs))
    row("the store's writer (agw-store): bytes read / written (per round)",
        lambda rs: "; ".join(f"{fmt(sio('others', 0)(r), 0)} / {fmt(sio('others', 1)(r), 0)}"
                             if sio("others", 0)(r) is not None else "n/a" for r in rs))
    on = [x for x in (ms(r) for r in recs("gateway")) if x is not None]
    if on:
        worst = max(on)
        ok = worst < STALL_GOAL_MS
        off = [x for x in (ms(r) for r in recs("gateway-nohist")) if x is not None]
        base = [x for x in (idle(r) for r in run.stall) if x is not None]
        out.append(f"\n- loop stall under a recording load: longest lateness with history on "
                   f"{worst:.2f} ms (history off: {fmt(max(off), 2) + ' ms' if off else 'n/a'}; "
                   f"idle, before the load: up to {fmt(max(base), 2) + ' ms' if base else 'n/a'}), "
                   f"goal < {STALL_GOAL_MS:.0f} ms: {'MET' if ok else 'MISSED'}")
        own_on = [x for x in (own(r) for r in recs("gateway")) if x is not None]
        own_off = [x for x in (own(r) for r in recs("gateway-nohist")) if x is not None]
        if own_on:
            out.append(f"- of that lateness, the loop's own part (less the time its thread waited for a CPU: "
                       f"the writer's or another process's turn, the machine's noise): history on "
                       f"{max(own_on):.2f} ms, off {fmt(max(own_off), 2) + ' ms' if own_off else 'n/a'} "
                       f"({'under' if max(own_on) < STALL_GOAL_MS else 'NOT under'} {STALL_GOAL_MS:.0f} ms)")
        busy_on = [x for x in (busy(r) for r in recs("gateway")) if x is not None]
        busy_off = [x for x in (busy(r) for r in recs("gateway-nohist")) if x is not None]
        if busy_on:
            out.append(f"- of that own part, the loop running its own work (at most; the rest it slept): "
                       f"history on {max(busy_on):.2f} ms, off {fmt(max(busy_off), 2) + ' ms' if busy_off else 'n/a'} "
                       f"({'under' if max(busy_on) < STALL_GOAL_MS else 'NOT under'} {STALL_GOAL_MS:.0f} ms)")
        un_on = [x for x in (unshared(r) for r in recs("gateway")) if x is not None]
        un_off = [x for x in (unshared(r) for r in recs("gateway-nohist")) if x is not None]
        if un_on:
            per = ", ".join(fmt(x, 2) for x in un_on)
            over = sum(1 for x in un_on if x >= STALL_GOAL_MS)

            def ref_own(r):
                xs = in_window(r, "probe_reference")
                return max((x[2] for x in xs), default=0.0) if xs is not None else None
            refs = [x for x in (ref_own(r) for r in run.stall) if x is not None]
            out.append(f"- the loop's own part under the load (its latenesses within the load's window), less "
                       f"the reference's own part at the same moments (a bare loop on its CPU: the machine's pauses): "
                       f"history on {max(un_on):.2f} ms (per round {per}; {over} of {len(un_on)} rounds at "
                       f"{STALL_GOAL_MS:.0f} ms or more), off {fmt(max(un_off), 2) + ' ms' if un_off else 'n/a'} "
                       f"({'under' if max(un_on) < STALL_GOAL_MS else 'NOT under'} {STALL_GOAL_MS:.0f} ms); the "
                       f"reference's own part alone in the same windows, all rounds: up to "
                       f"{fmt(max(refs), 2) + ' ms' if refs else 'n/a'}")
        loop_io = [sio("loop", i)(r) for r in recs("gateway") for i in (0, 1)]
        if loop_io and None not in loop_io:
            out.append(f"- the event loop's own storage I/O under that load (kernel accounting, all "
                       f"rounds): {sum(loop_io):.0f} bytes ({'none: it never touches the disk' if sum(loop_io) == 0 else 'NOT zero'})")


if __name__ == "__main__":
    main()
