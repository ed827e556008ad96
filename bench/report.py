"""Print the Markdown summary of a bench/run.sh results directory: python3 bench/report.py DIR."""
import collections
import json
import sys
from pathlib import Path


NAMES = {"before": "llmgw, no limit (just before)", "limits": "llmgw, limits binding",
         "after": "llmgw, no limit (just after)"}


def load(res):
    runs = {}
    for f in res.glob("*.json"):
        r = json.loads(f.read_text())
        runs[r["label"]] = r
    return runs


def fmt(v, nd=2):
    return "–" if v is None else f"{v:,.{nd}f}"


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def profile_summary(path, top=12):
    """Self and inclusive sample shares from py-spy's raw (collapsed) output."""
    self_c, incl = collections.Counter(), collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit() or "gevent/threadpool.py" in stack:
            continue  # gevent's threadpool threads wait on a queue; only the hub thread serves
        n = int(n)
        total += n
        frames = stack.split(";")
        self_c[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    if not total:
        return ["(no samples)"]
    out = [f"{total} samples of the serving thread (idle threadpool threads left out). "
           f"Self time, top {top}:", ""]
    out += [f"- {n / total:6.1%}  {f}" for f, n in self_c.most_common(top)]
    out += ["", "Inclusive time of llmgw / requests / werkzeug / gevent / sqlite frames, top 15:", ""]
    keep = [(f, n) for f, n in incl.most_common() if any(
        k in f for k in ("llmgw/", "requests/", "urllib3/", "werkzeug/", "peewee", "sqlite",
                         "flask/", "gevent/", "http/client"))]
    out += [f"- {n / total:6.1%}  {f}" for f, n in keep[:15]]
    return out


def main():
    res = Path(sys.argv[1])
    runs = load(res)
    print("# llmgw benchmark\n")
    print("```\n" + (res / "env.txt").read_text().strip() + "\n```\n")
    targets = [t for t in ("direct", "llmgw", "litellm") if f"ns0-{t}" in runs]
    for kind, title in (("ns0", "Non-streamed, upstream 0 ms"), ("ns50", "Non-streamed, upstream 50 ms"),
                        ("stream", "Streamed, 100 chunks")):
        print(f"## {title}\n")
        stream = kind == "stream"
        cols = ["target", "ok", "errors", "req/s", "p50 ms", "p95 ms", "p99 ms"]
        if stream:
            cols += ["TTFC p50 ms", "TTFC p95 ms", "TTFC p99 ms", "chunks/s"]
        cols += ["added p50 ms", "added p95 ms", "added p99 ms"]
        if stream:
            cols += ["added TTFC p50 ms"]
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        d = runs.get(f"{kind}-direct")
        shown = targets + [t for t in ("before", "limits", "after") if f"{kind}-{t}" in runs]
        for t in shown:
            r = runs.get(f"{kind}-{t}")
            if not r:
                continue
            row = [NAMES.get(t, t), str(r["ok"]), str(r["errors"]), fmt(r["req_s"], 0), fmt(r["p50_ms"]),
                   fmt(r["p95_ms"]), fmt(r["p99_ms"])]
            if stream:
                row += [fmt(r["ttfc_p50_ms"]), fmt(r["ttfc_p95_ms"]), fmt(r["ttfc_p99_ms"]),
                        fmt(r["chunks_s"], 0)]
            add = lambda k: None if not d or r[k] is None or d[k] is None else r[k] - d[k]
            row += [fmt(add("p50_ms")), fmt(add("p95_ms")), fmt(add("p99_ms"))]
            if stream:
                row += [fmt(add("ttfc_p50_ms"))]
            print("| " + " | ".join(row) + " |")
        print()
        g, l = runs.get(f"{kind}-llmgw"), runs.get(f"{kind}-litellm")
        parts = []
        for name, a, b in (("llmgw/direct", g, d), ("litellm/direct", l, d), ("llmgw/litellm", g, l)):
            if a and b:
                parts.append(f"{name}: req/s {fmt(ratio(a['req_s'], b['req_s']))}×, "
                             f"p50 {fmt(ratio(a['p50_ms'], b['p50_ms']))}×, "
                             f"p99 {fmt(ratio(a['p99_ms'], b['p99_ms']))}×")
        lim = runs.get(f"{kind}-limits")
        base = [r for r in (runs.get(f"{kind}-before"), runs.get(f"{kind}-after")) if r] or ([g] if g else [])
        if lim and base and lim["p50_ms"] is not None and all(b["p50_ms"] is not None for b in base):
            req_s = sum(b["req_s"] for b in base) / len(base)
            p50 = sum(b["p50_ms"] for b in base) / len(base)
            parts.append(f"limits binding/none (the mean of the {len(base)} no-limit run(s) beside it): "
                         f"req/s {fmt(ratio(lim['req_s'], req_s))}×, p50 {fmt(lim['p50_ms'] - p50)} ms more")
        if parts:
            print("Ratios — " + "; ".join(parts) + "\n")
        for t in shown:
            r = runs.get(f"{kind}-{t}")
            if r and (r["errors"] or r["unsent"]):
                print(f"- {t}: errors {r['error_kinds']}, unsent {r['unsent']}, "
                      f"samples {r['error_samples'][:1]}")
        print()

    lat = {t: runs.get(f"lat-{t}") for t in ("before", "limits", "after")}
    if lat["limits"]:
        print("## Latency with limits, one request at a time (upstream 0 ms)\n")
        print("At concurrency 32 the workers are saturated and a p50 is mostly time spent queued, "
              "so what limits add to each request's own time is measured one request at a time.\n")
        print("| run | ok | errors | p50 ms | p95 ms | p99 ms |")
        print("|---|---|---|---|---|---|")
        for t, r in lat.items():
            if r:
                print(f"| {NAMES[t]} | {r['ok']} | {r['errors']} | {fmt(r['p50_ms'], 3)} | "
                      f"{fmt(r['p95_ms'], 3)} | {fmt(r['p99_ms'], 3)} |")
        base = [r for t, r in lat.items() if t != "limits" and r and r["p50_ms"] is not None]
        if base and lat["limits"]["p50_ms"] is not None:
            p50 = sum(r["p50_ms"] for r in base) / len(base)
            print(f"\nlimits binding/none at concurrency 1: p50 {fmt(lat['limits']['p50_ms'] - p50, 3)} ms more "
                  f"than the mean of the {len(base)} no-limit run(s) beside it\n")

    cpu_file = res / "cpu.jsonl"
    if cpu_file.exists():
        print("## CPU per request, non-streamed at 0 ms (ms of user + system time)\n")
        print("The llmgw workers' CPU, and every PostgreSQL process's on the machine (0 on SQLite).\n")
        print("| run | requests | workers ms/request | PostgreSQL ms/request |")
        print("|---|---|---|---|")
        for line in cpu_file.read_text().splitlines():
            c = json.loads(line)
            r = runs.get(c["label"])
            if r and c["label"] in ("ns0-llmgw", "ns0-before", "ns0-limits", "ns0-after"):
                n = r["ok"] + r["errors"]
                print(f"| {NAMES.get(c['label'][4:], c['label'])} | {n} | {fmt(1000 * c['workers_s'] / n, 3)} | "
                      f"{fmt(1000 * c['db_s'] / n, 3)} |")
        print()

    rss_file = res / "rss.jsonl"
    if rss_file.exists():
        print("## llmgw worker RSS (VmRSS, MB)\n")
        rows = [json.loads(x) for x in rss_file.read_text().splitlines() if x.strip()]
        pids = sorted({p for r in rows for p in r["workers"]})
        print("| point | " + " | ".join(f"worker {p}" for p in pids) + " |")
        print("|---|" + "---|" * len(pids))
        for r in rows:
            print(f"| {r['label']} | " + " | ".join(
                fmt(r["workers"][p] / 1024, 1) if p in r["workers"] else "gone" for p in pids) + " |")
        rr = [runs[k] for k in sorted(runs) if k.startswith("rss-")]
        if rr:
            print(f"\nRSS run: {sum(r['ok'] for r in rr)} ok, {sum(r['errors'] for r in rr)} errors, "
                  f"req/s per quarter {[r['req_s'] for r in rr]}\n")

    print("## 1,000 concurrent streams (100 chunks, 20 ms apart, about 2 s each)\n")
    print("| target | ok | errors | wall s | p50 ms | p99 ms | TTFC p50 ms | TTFC p99 ms | errors by kind |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in ("c1000-direct", "c1000-llmgw-1worker"):
        r = runs.get(k)
        if r:
            print(f"| {k} | {r['ok']} | {r['errors']} | {r['wall_s']} | {fmt(r['p50_ms'])} | "
                  f"{fmt(r['p99_ms'])} | {fmt(r['ttfc_p50_ms'])} | {fmt(r['ttfc_p99_ms'])} | "
                  f"{r['error_kinds'] or ''} |")
    print()
    for name in ("profile.txt", "profile-stream.txt", "profile-limits.txt"):
        if (res / name).exists():
            print(f"## py-spy profile of one llmgw worker ({name})\n")
            print("\n".join(profile_summary(res / name)) + "\n")
    if (res / "ps-end.txt").exists():
        print("Busiest processes at the end (other work on the machine skews every number):\n")
        print("```\n" + (res / "ps-end.txt").read_text().rstrip() + "\n```")


if __name__ == "__main__":
    main()
