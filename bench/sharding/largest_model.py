#!/usr/bin/env python3
"""The sharding benchmark of issue 27, in one run (bench/sharding/run.sh calls this).

For each model-state setting (no sharding, ZeRO stage 1, stage 2, stage 2 + 8-bit AdamW
moments) it finds the largest GPT (d_model 768, n_layer grown) that trains 2 steps on
`--np` ranks under a per-rank CPU budget (`--memory-budget`, the tracking allocator's hard
limit) with exit 0 and no out-of-memory back-off; every probe is a real `leantrain train`
run under mpirun. Then it runs every setting a few steps on the largest n_layer all of them
fit and compares samples/s and the bytes each rank sends per step with no sharding's.
The results go to stdout and between the markers of docs/BENCH_SHARDING.md.

Standard library only. A probe that fails for any reason other than the budget (a crash, a
hang past --probe-timeout, an error that is neither the startup refusal nor an
out-of-memory) stops the benchmark with the command and its output: that is a leantrain
bug to report, not a data point.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

# name, memory.shard, memory.optimizer_state, memory.grad_accum_dtype
SETTINGS = [
    ("none", "none", "fp32", "fp32"),
    ("stage 1 (optimizer)", "optimizer", "fp32", "fp32"),
    ("stage 2 (gradients)", "gradients", "fp32", "fp32"),
    ("stage 2 + int8 state", "gradients", "int8", "fp32"),
    ("stage 2 + int8 state + bf16 gradient sums", "gradients", "int8", "bf16"),
]

BEGIN = "<!-- BEGIN sharding results -->"
END = "<!-- END sharding results -->"

# Why a probe did not fit; anything else is a leantrain failure.
FITS, REFUSED, OOM, BACKOFF = "fits", "refused at startup", "out of memory in a step", "backed off"


class LeantrainFailure(RuntimeError):
    pass


def mib(b):
    return f"{b / 1048576:.1f}"


def fmt_params(n):
    return f"{n / 1e6:.1f}M"


class Bench:
    def __init__(self, args):
        self.a = args
        self.top = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
        self.work = args.workdir or tempfile.mkdtemp(prefix="leantrain-bench-sharding-")
        os.makedirs(self.work, exist_ok=True)
        self.cache = {}  # (setting name, n_layer) -> probe result
        self.runs = 0

    def command(self, n_layer, shard, state, sums, steps, out):
        a = self.a
        sets = {
            "model.n_layer": n_layer,
            "model.d_model": 768,
            "model.n_head": 12,
            "model.vocab_size": 50257,
            "model.seq_len": a.seq_len,
            "model.dropout": 0,
            "data.kind": '"synthetic"',
            "data.synthetic_samples": 256,
            "train.optimizer": '"adamw"',
            "train.micro_batch": 1,
            "train.global_batch": a.np,  # ranks x micro-batch 1, no accumulation
            "train.steps": steps,
            "train.eval_batch": 1,  # the epoch-end evaluation: one sample, so it costs nothing
            "train.eval_max_batches": 1,
            "precision.mode": f'"{a.precision}"',
            "memory.recompute": '"full"',
            "memory.shard": f'"{shard}"',
            "memory.optimizer_state": f'"{state}"',
            "memory.grad_accum_dtype": f'"{sums}"',
            "checkpoint.at_end": "false",
            "log.progress": '"none"',
        }
        cmd = ["mpirun", "-np", str(a.np), "--mca", "mpi_yield_when_idle", "1", a.bin, "train",
               "--config", os.path.join(self.top, "configs", "gpt2_small.toml"), "--out", out,
               "--memory-budget", a.budget]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        return cmd

    def run(self, name, shard, state, sums, n_layer, steps, tag):
        """One leantrain run; returns a dict with 'status' in FITS/REFUSED/OOM/BACKOFF."""
        out = os.path.join(self.work, f"{tag}-{shard}-{state}-{sums}-L{n_layer}-s{steps}")
        cmd = self.command(n_layer, shard, state, sums, steps, out)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        t0 = time.monotonic()
        self.runs += 1
        try:
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=self.a.probe_timeout, cwd=self.top)
        except subprocess.TimeoutExpired as e:
            raise LeantrainFailure(f"hang: no exit after {self.a.probe_timeout} s\n  {shlex.join(cmd)}\n"
                                   f"{(e.stdout or '')[-3000:] if isinstance(e.stdout, str) else ''}")
        wall = time.monotonic() - t0
        log = p.stdout
        with open(out + ".log", "w") as f:
            f.write(log)
        r = {"n_layer": n_layer, "rc": p.returncode, "wall_s": wall, "cmd": shlex.join(cmd), "out": out}
        m = re.search(r"model gpt: (\d+) parameters", log)
        if m:
            r["params"] = int(m.group(1))
        events = []
        mpath = os.path.join(out, "metrics.jsonl")
        if os.path.exists(mpath):
            with open(mpath) as f:
                events = [json.loads(line) for line in f if line.strip()]
        r["steps"] = [e for e in events if e.get("event") == "step"]
        backoffs = [e for e in events if e.get("event") == "oom_backoff"]
        if p.returncode == 0 and not backoffs and len(r["steps"]) == steps:
            r["status"] = FITS
        elif p.returncode == 0 and backoffs:
            r["status"] = BACKOFF
        elif p.returncode == 2 and "this run holds before any activation" in log:
            r["status"] = REFUSED
            m = re.search(r"is below the [^(]*\((\d+) bytes\) this run holds", log)
            if m:
                r["minimum_bytes"] = int(m.group(1))
        elif p.returncode != 0 and re.search(r"out of memory", log, re.I):
            r["status"] = OOM
        else:
            raise LeantrainFailure(f"leantrain failed (exit {p.returncode}, {len(r['steps'])} of {steps} step "
                                   f"records) at n_layer {n_layer}, {name}:\n  {shlex.join(cmd)}\n"
                                   f"--- last lines of its output ---\n{log[-4000:]}")
        return r

    def probe(self, setting, n_layer):
        name, shard, state, sums = setting
        key = (name, n_layer)
        if key not in self.cache:
            r = self.run(name, shard, state, sums, n_layer, self.a.probe_steps, "probe")
            self.cache[key] = r
            extra = ""
            if r["status"] == FITS:
                extra = f", peak {mib(r['steps'][-1]['peak_mem_bytes'])} MiB"
            elif "minimum_bytes" in r:
                extra = f" (minimum {mib(r['minimum_bytes'])} MiB)"
            print(f"  [{name}] n_layer {n_layer:3d}: {r['status']}{extra}  ({r['wall_s']:.0f} s)", flush=True)
        return self.cache[key]

    def largest(self, setting, seed):
        """Doubling from `seed` while it fits, then bisection: the largest n_layer that fits
        (0 if none does) and the probe of the next one (why it stops there)."""
        fits = lambda n: self.probe(setting, n)["status"] == FITS
        lo, hi = 0, None  # lo fits (0: nothing known), hi does not
        n = max(1, seed)
        while n <= self.a.max_layers:
            if fits(n):
                lo = n
                n *= 2
            else:
                hi = n
                break
        if hi is None:
            if lo == self.a.max_layers:
                return lo, None
            hi = self.a.max_layers + 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        nxt = self.cache.get((setting[0], hi))
        return lo, nxt

    def speed(self, n_layer):
        """Every setting on the same model, interleaved over rounds; the first step of each
        run is warm-up. Returns per setting: samples/s, comm bytes per step, calls."""
        acc = {s[0]: {"samples": 0.0, "seconds": 0.0, "comm": [], "rs": [], "ag": [], "ar": [], "rates": []}
               for s in SETTINGS}
        for rnd in range(self.a.speed_rounds):
            for name, shard, state, sums in SETTINGS:
                r = self.run(name, shard, state, sums, n_layer, self.a.speed_steps, f"speed{rnd}")
                if r["status"] != FITS:
                    raise LeantrainFailure(f"{name} at n_layer {n_layer} fitted in the search but "
                                           f"{r['status']} in the timed run:\n  {r['cmd']}")
                timed = r["steps"][1:]
                a = acc[name]
                a["params"] = r.get("params", 0)
                samples = sum(self.a.np * s["micro_batch"] * s["accumulation"] for s in timed)
                seconds = sum(s["step_time_s"] for s in timed)
                a["samples"] += samples
                a["seconds"] += seconds
                a["rates"].append(samples / seconds)
                a["comm"] += [s["comm_bytes"] for s in timed]
                a["rs"] += [s.get("grad_reduce_scatter_calls", 0) for s in timed]
                a["ag"] += [s.get("param_allgather_calls", 0) for s in timed]
                a["ar"] += [s.get("grad_allreduce_calls", 0) for s in timed]
                print(f"  [{name}] round {rnd + 1}: {samples / seconds:.3f} samples/s, "
                      f"comm {mib(sum(a['comm'][-len(timed):]) / len(timed))} MiB/step  ({r['wall_s']:.0f} s)",
                      flush=True)
        res = {}
        for name, a in acc.items():
            res[name] = {"samples_per_s": a["samples"] / a["seconds"], "rates": a["rates"],
                         "comm_bytes": sum(a["comm"]) / len(a["comm"]),
                         "reduce_scatter_calls": max(a["rs"]), "allgather_calls": max(a["ag"]),
                         "allreduce_calls": max(a["ar"]), "params": a["params"]}
        return res


def loadavg():
    try:
        return " / ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def machine():
    model = "?"
    try:
        for line in subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def commit(top):
    try:
        h = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=top, stdout=subprocess.PIPE,
                           text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=top,
                               stdout=subprocess.PIPE, text=True).stdout.strip()
        return h + (" + uncommitted edits in the tree" if dirty else "")
    except OSError:
        return "?"


def render(a, b, found, speed, common, wall, load_start, load_end):
    none_params = found[SETTINGS[0][0]]["params"]
    lines = [
        f"Measured at commit `{b.commit}` (binary `{os.path.relpath(a.bin, b.top)}` built {b.bin_time}), {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, on {machine()}, "
        f"{a.np} ranks under mpirun (1 intra-op thread each), `--memory-budget {a.budget}` per rank, "
        f"precision {a.precision}; {wall / 60:.1f} min wall, {b.runs} leantrain runs; "
        f"load average {load_start} at the start, {load_end} at the end.",
        "",
        f"    bash bench/sharding/run.sh{(' ' + ' '.join(a.passthrough)) if a.passthrough else ''}",
        "",
        f"**Largest model that trains {a.probe_steps} steps** (GPT d_model 768, 12 heads, vocab 50257, "
        f"seq {a.seq_len}, micro-batch 1, global batch {a.np}, AdamW, recompute full). Bytes: rank 0's "
        "tracking allocator in the last step (MiB; gradients alive only during backward count as "
        "activations); the last column is why one layer more does not run.",
        "",
        "| setting | largest n_layer | parameters | vs none | params | grads | optimizer | comm buffers "
        "| activations | peak | one layer more |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, *_ in SETTINGS:
        f = found[name]
        if f["n_layer"] == 0:
            lines.append(f"| {name} | none fits | | | | | | | | | |")
            continue
        s = f["last"]
        nxt = f["next"]
        why = "-" if nxt is None else nxt["status"]
        if nxt is not None and "minimum_bytes" in nxt:
            why += f" (minimum {mib(nxt['minimum_bytes'])} MiB)"
        lines.append(
            f"| {name} | {f['n_layer']} | {fmt_params(f['params'])} | **{f['params'] / none_params:.2f}x** | "
            f"{mib(s['mem_params_bytes'])} | {mib(s['mem_grads_bytes'])} | {mib(s['mem_optimizer_bytes'])} | "
            f"{mib(s['mem_comm_buffers_bytes'])} | {mib(s['mem_activations_bytes'])} | "
            f"{mib(s['peak_mem_bytes'])} | {why} |")
    lines += [
        "",
        f"**Speed and communication on n_layer {common}** (the largest all {len(SETTINGS)} fit, "
        f"{fmt_params(speed[SETTINGS[0][0]]['params'])} parameters): {a.speed_steps} steps per run, the first one warm-up, {a.speed_rounds} rounds "
        "taking turns over the settings; samples/s = timed samples / timed step seconds (rounds in "
        "brackets); comm = bytes rank 0 sent per step (ring-counted).",
        "",
        "| setting | samples/s | vs none | comm MiB/step | vs none | collectives per step |",
        "|---|---|---|---|---|---|",
    ]
    base = speed[SETTINGS[0][0]]
    for name, *_ in SETTINGS:
        s = speed[name]
        calls = (f"{s['allreduce_calls']} all-reduce" if s["allreduce_calls"] else
                 f"{s['reduce_scatter_calls']} reduce-scatter + {s['allgather_calls']} all-gather")
        rounds = ", ".join(f"{x:.3f}" for x in s["rates"])
        lines.append(f"| {name} | {s['samples_per_s']:.3f} ({rounds}) | **{s['samples_per_s'] / base['samples_per_s']:.2f}x** | "
                     f"{mib(s['comm_bytes'])} | **{s['comm_bytes'] / base['comm_bytes']:.3f}x** | {calls} |")
    int8 = found[SETTINGS[3][0]]["params"] / none_params
    sums = found[SETTINGS[4][0]]["params"] / none_params
    worst_comm = max(speed[n]["comm_bytes"] / base["comm_bytes"] for n, *_ in SETTINGS)
    lines += [
        "",
        f"Goals (issue 27): stage 2 + int8 fits **{int8:.2f}x** the parameters of no sharding with FP32 "
        f"gradient sums, **{sums:.2f}x** with bf16 ones (goal >= 2.5x): "
        f"**{'met' if int8 >= 2.5 else 'missed'}** / **{'met' if sums >= 2.5 else 'missed'}**. "
        f"Communication per step at most "
        f"**{worst_comm:.3f}x** the all-reduce's (goal <= 1.1x): **{'met' if worst_comm <= 1.1 else 'missed'}**.",
    ]
    return "\n".join(lines)


def write_doc(path, block):
    text = open(path).read() if os.path.exists(path) else f"# Sharding benchmark\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text = text.rstrip("\n") + f"\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(path, "w") as f:
        f.write(f"{head}{BEGIN}\n{block}\n{END}{tail}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.environ.get("LEANTRAIN_BIN", ""), help="leantrain binary (default build/bin/leantrain)")
    ap.add_argument("--np", type=int, default=2, help="ranks")
    ap.add_argument("--budget", default="2GiB", help="per-rank memory budget")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--probe-steps", type=int, default=2)
    ap.add_argument("--speed-steps", type=int, default=4)
    ap.add_argument("--speed-rounds", type=int, default=2)
    ap.add_argument("--max-layers", type=int, default=256)
    ap.add_argument("--probe-timeout", type=int, default=1200, help="seconds before a run counts as hung")
    ap.add_argument("--workdir", default="", help="where the runs write (default: a new /tmp directory)")
    ap.add_argument("--commit", default="", help="the commit the binary was built from (default: the tree's HEAD)")
    ap.add_argument("--doc", default="docs/BENCH_SHARDING.md", help="'' to leave the doc alone")
    a, rest = ap.parse_known_args()
    if rest:
        ap.error(f"unknown arguments {rest}")
    a.passthrough = sys.argv[1:]
    b = Bench(a)
    a.bin = os.path.abspath(a.bin or os.path.join(b.top, "build", "bin", "leantrain"))
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"no leantrain binary at {a.bin}: build it (bash scripts/build.sh) or pass --bin")
    b.commit = a.commit or commit(b.top)
    b.bin_time = datetime.datetime.utcfromtimestamp(os.path.getmtime(a.bin)).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.monotonic()
    load_start = loadavg()
    print(f"sharding benchmark: {a.bin}, {a.np} ranks, budget {a.budget}/rank, runs in {b.work}", flush=True)
    try:
        found = {}
        seed = 1
        for setting in SETTINGS:
            name = setting[0]
            print(f"[{time.monotonic() - t0:6.0f} s] largest n_layer for {name} (from {seed}, doubling then bisection)",
                  flush=True)
            n, nxt = b.largest(setting, seed)
            f = {"n_layer": n, "next": nxt}
            if n > 0:
                r = b.cache[(name, n)]
                f["params"] = r.get("params") or r["steps"][-1]["mem_params_bytes"] // 4
                f["last"] = r["steps"][-1]
                seed = n  # the next setting holds less per parameter: start where this one stopped
            found[name] = f
            print(f"  => {name}: n_layer {n}" + (f", {fmt_params(f['params'])} parameters" if n else ""), flush=True)
        common = min(f["n_layer"] for f in found.values())
        if common == 0:
            sys.exit("no setting fits even one layer under this budget")
        print(f"[{time.monotonic() - t0:6.0f} s] speed on n_layer {common}", flush=True)
        speed = b.speed(common)
    except LeantrainFailure as e:
        print(f"\nSTOPPED: {e}", file=sys.stderr)
        sys.exit(1)
    wall = time.monotonic() - t0
    block = render(a, b, found, speed, common, wall, load_start, loadavg())
    print("\n" + block + "\n")
    with open(os.path.join(b.work, "results.json"), "w") as f:
        json.dump({"found": found, "speed": speed, "common_n_layer": common, "wall_s": wall}, f, indent=1, default=str)
    if a.doc:
        path = os.path.join(b.top, a.doc) if not os.path.isabs(a.doc) else a.doc
        write_doc(path, block)
        print(f"wrote {path}; runs and results.json in {b.work}")


if __name__ == "__main__":
    main()
