"""What the SQLite writer spent during one benchmark run: the difference of two /metrics scrapes
(before and after the run) of the store's histograms (skillstate_sqlite_*), one line each:
how many, the mean, the bucket bounds the 50th, 99th and 99.9th percentiles fall under, and the
largest bucket used. Used by scripts/bench-http.

    python3 scripts/bench_metrics.py before.txt after.txt
"""

import re
import sys

LINE = re.compile(r"^(skillstate_sqlite_\w+?)_(bucket|sum|count)(?:\{(.*)\})? (\S+)$")


def parse(path):
    series = {}
    with open(path, encoding="utf-8") as scrape:
        for line in scrape:
            found = LINE.match(line.strip())
            if not found:
                continue
            name, part, labels, value = found.groups()
            pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels or ""))
            bound = pairs.pop("le", None)
            key = name + "".join(f" {k}={v}" for k, v in sorted(pairs.items()))
            entry = series.setdefault(key, {"buckets": {}, "sum": 0.0, "count": 0.0})
            if part == "bucket":
                entry["buckets"][float(bound)] = float(value)
            else:
                entry[part] = float(value)
    return series


def quantile(buckets, count, q):
    for bound in sorted(buckets):
        if buckets[bound] >= q * count:
            return bound
    return float("inf")


def show(value, seconds):
    if value == float("inf"):
        return "   >max"
    return f"{value * 1000:7.2f}" if seconds else f"{value:7.0f}"


def main():
    before, after = parse(sys.argv[1]), parse(sys.argv[2])
    print(f"{'store histogram (this run)':52} {'count':>8} {'mean':>8} {'p50<=':>7} {'p99<=':>7} {'p99.9<=':>7} {'max<=':>7}")
    for key in sorted(after):
        now, then = after[key], before.get(key, {"buckets": {}, "sum": 0.0, "count": 0.0})
        count = now["count"] - then["count"]
        if count <= 0:
            continue
        buckets = {b: n - then["buckets"].get(b, 0.0) for b, n in now["buckets"].items()}
        seconds = key.split()[0].endswith("_seconds")
        largest = min((b for b in sorted(buckets) if buckets[b] >= count), default=float("inf"))
        mean = (now["sum"] - then["sum"]) / count
        unit = " (ms)" if seconds else ""
        print(
            f"{key + unit:52} {count:8.0f} {show(mean, seconds)[-8:]:>8} "
            f"{show(quantile(buckets, count, 0.5), seconds)} {show(quantile(buckets, count, 0.99), seconds)} "
            f"{show(quantile(buckets, count, 0.999), seconds)} {show(largest, seconds)}"
        )


if __name__ == "__main__":
    main()
