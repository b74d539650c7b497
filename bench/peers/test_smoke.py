#!/usr/bin/env python3
"""The peer bench's machinery, end to end on tiny models (CTest: peers_smoke, ~30 s + ~60 s for
the Llama rows).

Runs `compare.py --scale smoke --repeats 1` (gpt, bert, resnet in fp32 and gpt in bf16 with
full activation recompute; 1 rank; the collective and checkpoint rows at tiny sizes) and
checks what it produced: the markdown table with every row, results.jsonl with the three
metrics per row (positive numbers) and the two bench rows, and the final losses of the two
sides within 1% (fp32: within 1e-4 relative: same samples, same initial weights, same
optimizer and schedule; dropout is 0 in the smoke models). A negative control reruns the
peer of the first row with data.seed + 1: its final loss must then differ by more than
1e-3, so the loss comparison is shown to be able to fail.

Then the Llama rows (Note [Llama peers] in compare.py): `--models llama` (fp32 against HF,
titan eager and titan compiled; bf16 with full recompute against the two eager ones), checked
the same way per peer ("<row> vs <peer>" in results.jsonl), with the same negative control on
the titan peer; the compiled peer may instead be reported unavailable (torch.compile failed on
this machine), its error then printed. Before that, test_llama_peers.py (the two peers give the
same logits and losses from the same weights, no leantrain needed).

    .venv/bin/python bench/peers/test_smoke.py BIN_DIR
Exit codes: 0 pass, 1 fail, 77 skipped (no leantrain binary)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main(argv) -> int:
    bindir = argv[1] if len(argv) > 1 else os.path.join(ROOT, "build", "bin")
    if not os.access(os.path.join(bindir, "leantrain"), os.X_OK):
        print(f"skipped: no leantrain in {bindir}")
        return 77
    failures = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        out, doc = os.path.join(tmp, "out"), os.path.join(tmp, "BENCH.md")
        cmd = [sys.executable, os.path.join(HERE, "compare.py"), "--scale", "smoke", "--repeats", "1",
               "--bin", bindir, "--out", out, "--doc", doc, "--keep"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        print(r.stdout[-3000:])
        check(r.returncode == 0, f"compare.py --scale smoke exits 0 (got {r.returncode}){r.stderr[-2000:] if r.returncode else ''}")
        if r.returncode != 0:
            return 1
        labels = subprocess.run(cmd[:2] + ["--scale", "smoke", "--bin", bindir, "--out", out, "--list"],
                                capture_output=True, text=True).stdout.split("\n")
        labels = [l for l in labels if l]
        check(len(labels) == 4, f"4 smoke rows listed ({labels})")
        text = open(doc).read()
        check("Measured at commit `" in text, "the doc names the commit")
        for label in labels:
            check(f"| {label} |" in text, f"the table has the row '{label}'")
        with open(os.path.join(out, "results.jsonl")) as fh:
            lines = [json.loads(l) for l in fh]
        by = {(l["row"], l["metric"]): l for l in lines}
        check(all(l["bench"] == "peers" and set(l) == {"bench", "row", "metric", "value", "baseline"} for l in lines),
              "every results.jsonl line has exactly bench, row, metric, value, baseline")
        for label in labels:
            for metric in ("samples_per_s", "peak_rss_bytes", "final_loss"):
                l = by.get((label, metric))
                check(l is not None and l["value"] > 0 and l["baseline"] > 0,
                      f"{label}: {metric} {l and l['value']} vs {l and l['baseline']} (both > 0)")
            l = by.get((label, "final_loss"))
            if l:
                rel = abs(l["value"] - l["baseline"]) / abs(l["baseline"])
                bound = 1e-4 if " fp32 " in f" {label} " else 1e-2
                check(rel <= bound, f"{label}: final loss leantrain {l['value']:.7f}, peer {l['baseline']:.7f} "
                                    f"(rel diff {rel:.2e} <= {bound:g})")
        metrics = {l["metric"] for l in lines}
        check({"busbw_gb_s", "write_mib_per_s"} <= metrics, "the collective and checkpoint rows are there")

        # Negative control: the first row's peer on other samples.
        first = labels[0]
        rdir = os.path.join(out, "runs", first.replace(" ", "_"))
        cfg = json.load(open(os.path.join(rdir, "peer_config.json")))
        cfg["data"]["seed"] += 1
        bad_cfg = os.path.join(tmp, "seed_plus_1.json")
        json.dump(cfg, open(bad_cfg, "w"))
        model = first.split()[0]
        init = os.path.join(out, "runs", f"init-{model}", "checkpoints", "step-00000001.h5")
        bad_out = os.path.join(tmp, "bad")
        r = subprocess.run([sys.executable, os.path.join(HERE, "ddp_recipe.py"), "--config", bad_cfg, "--init", init,
                            "--out", bad_out], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tools")))
        check(r.returncode == 0, f"the negative-control peer run exits 0 {r.stderr[-1000:] if r.returncode else ''}")
        if r.returncode == 0:
            steps = [json.loads(l) for l in open(os.path.join(bad_out, "metrics.jsonl"))]
            want = by[(first, "final_loss")]["value"]
            rel = abs(steps[-1]["loss"] - want) / abs(want)
            check(rel > 1e-3, f"negative control: with data.seed + 1 the peer's final loss {steps[-1]['loss']:.6f} "
                              f"differs from leantrain's {want:.6f} (rel {rel:.2e} > 1e-3)")
        llama_rows(bindir, tmp, check)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


def llama_rows(bindir: str, tmp: str, check) -> None:
    """compare.py --scale smoke --models llama, and its checks (module docstring)."""
    r = subprocess.run([sys.executable, os.path.join(HERE, "test_llama_peers.py")], capture_output=True, text=True,
                       timeout=300)
    print(r.stdout[-2000:])
    check(r.returncode == 0, f"test_llama_peers.py: the Llama peers agree with each other {r.stderr[-1500:]}")
    options = subprocess.run([os.path.join(bindir, "leantrain"), "options"], capture_output=True, text=True).stdout
    has_llama = '[model] kind = "llama"' in options
    check(has_llama, "leantrain has the llama model kind (`leantrain options`)")
    if not has_llama:
        return
    out, doc = os.path.join(tmp, "llama"), os.path.join(tmp, "LLAMA.md")
    cmd = [sys.executable, os.path.join(HERE, "compare.py"), "--scale", "smoke", "--models", "llama", "--repeats", "1",
           "--no-extra", "--bin", bindir, "--out", out, "--doc", doc, "--keep"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(r.stdout[-3000:])
    check(r.returncode == 0,
          f"compare.py --models llama exits 0 (got {r.returncode}){r.stderr[-2000:] if r.returncode else ''}")
    if r.returncode != 0:
        return
    listed = subprocess.run(cmd[:2] + ["--scale", "smoke", "--models", "llama", "--bin", bindir, "--out", out, "--list"],
                            capture_output=True, text=True).stdout
    labels = [l for l in listed.split("\n") if l]
    check(labels == ["llama 1r fp32 ckpt-none", "llama 1r bf16 ckpt-full"], f"2 Llama smoke rows listed ({labels})")
    text = open(doc).read()
    for label in labels:
        check(f"| {label} |" in text, f"the Llama table has the row '{label}'")
    with open(os.path.join(out, "results.jsonl")) as fh:
        by = {(l["row"], l["metric"]): l for l in (json.loads(x) for x in fh)}
    details = {d["label"]: d for d in json.load(open(os.path.join(out, "details.json")))["rows"]}
    for label in labels:
        peers = ("hf", "titan", "titan-compiled") if " fp32 " in f" {label} " else ("hf", "titan")
        unavailable = details[label].get("unavailable", {})
        for peer in peers:
            if peer in unavailable:
                check(peer == "titan-compiled", f"{label}: {peer} unavailable: {unavailable[peer][:500]}")
                print(f"note {label}: the compiled peer is reported unavailable: {unavailable[peer][:500]}")
                continue
            row = f"{label} vs {peer}"
            for metric in ("samples_per_s", "peak_rss_bytes", "final_loss"):
                l = by.get((row, metric))
                check(l is not None and l["value"] > 0 and l["baseline"] > 0,
                      f"{row}: {metric} {l and l['value']} vs {l and l['baseline']} (both > 0)")
            l = by.get((row, "final_loss"))
            if l:
                rel = abs(l["value"] - l["baseline"]) / abs(l["baseline"])
                bound = 1e-4 if " fp32 " in f" {label} " else 1e-2
                check(rel <= bound, f"{row}: final loss leantrain {l['value']:.7f}, peer {l['baseline']:.7f} "
                                    f"(rel diff {rel:.2e} <= {bound:g})")

    # Negative control: the titan peer of the fp32 row on other samples.
    first = labels[0]
    rdir = os.path.join(out, "runs", first.replace(" ", "_"))
    cfg = json.load(open(os.path.join(rdir, "peer_config.json")))
    cfg["data"]["seed"] += 1
    bad_cfg = os.path.join(tmp, "llama_seed_plus_1.json")
    json.dump(cfg, open(bad_cfg, "w"))
    init = os.path.join(out, "runs", "init-llama", "checkpoints", "step-00000001.h5")
    bad_out = os.path.join(tmp, "llama_bad")
    r = subprocess.run([sys.executable, os.path.join(HERE, "llama_recipe.py"), "--impl", "titan", "--config", bad_cfg,
                        "--init", init, "--out", bad_out], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tools")))
    check(r.returncode == 0, f"the Llama negative-control peer run exits 0 {r.stderr[-1000:] if r.returncode else ''}")
    if r.returncode == 0:
        steps = [json.loads(l) for l in open(os.path.join(bad_out, "metrics.jsonl"))]
        want = by[(f"{first} vs titan", "final_loss")]["value"]
        rel = abs(steps[-1]["loss"] - want) / abs(want)
        check(rel > 1e-3, f"Llama negative control: with data.seed + 1 the titan peer's final loss "
                          f"{steps[-1]['loss']:.6f} differs from leantrain's {want:.6f} (rel {rel:.2e} > 1e-3)")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
