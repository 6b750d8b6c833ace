"""Self-test of examples/tiny_llm/model.py across heterogeneous TP.

Cases (one line of output each; exit status 1 on any mismatch):

  (a) kv_heads=8: chunked prefill (2 chunks) at TP 2, KV heads regrouped
      into caches laid out for TP 4, greedy decode at TP 4.
  (b) kv_heads=2: prefill at TP 1, decode at TP 4 (each kv head
      replicated on two decode ranks).
  (c) TP 1 prefill + decode in one process, in shuffled pages.
  (d) negative control: decode from a cache whose kv heads are rotated by
      one must NOT match, proving (a)-(c) are sensitive to the head map.

No transfer engine is involved: prefill ranks save their caches to files
in a temp dir and each decode rank copies, page by page, the global kv
heads it owns from whichever prefill rank owns them.  Prefill and decode
use different page ids, so the page mapping is exercised too.  The decode
ranks never see the prompt tokens, only the cache, the prompt length and
the first token, so matching the reference means the KV moved correctly.

Run:  /usr/bin/python3 examples/tiny_llm/model_selftest.py
"""

import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as tiny  # noqa: E402  (needs the path set above)

PAGE_SIZE = 4          # small, so prompts span several pages
NUM_PAGES = 64         # per-rank pool; enough for all prompts of a case
MAX_NEW_TOKENS = 8
NUM_CHUNKS = 2
PROMPTS = tiny.make_prompts(3, seed=42, min_len=5, max_len=20)


# --------------------------------------------------------------------------
# Page assignment
# --------------------------------------------------------------------------

def assign_pages(prompts, seed):
    """Disjoint, shuffled page lists, one per prompt, each long enough for
    the prompt plus MAX_NEW_TOKENS positions."""
    perm = torch.randperm(NUM_PAGES,
                          generator=torch.Generator().manual_seed(seed))
    out, used = [], 0
    for p in prompts:
        n = tiny.pages_needed(len(p) + MAX_NEW_TOKENS, PAGE_SIZE)
        out.append([int(x) for x in perm[used:used + n]])
        used += n
    if used > NUM_PAGES:
        raise RuntimeError("NUM_PAGES too small for the prompts")
    return out


def chunks(tokens, n):
    """Split tokens into n consecutive, non-empty-as-possible chunks."""
    step = -(-len(tokens) // n)
    return [tokens[i:i + step] for i in range(0, len(tokens), step)]


# --------------------------------------------------------------------------
# Worker plumbing
# --------------------------------------------------------------------------

def _worker(rank, world, fn, case, tmpdir):
    """Entry point of every spawned rank: join the group, run fn."""
    torch.set_num_threads(1)
    if world > 1:
        init = f"file://{tmpdir}/{fn.__name__}.init"
        dist.init_process_group("gloo", init_method=init, rank=rank,
                                world_size=world)
    try:
        fn(rank, world, case, tmpdir)
    finally:
        if world > 1:
            dist.destroy_process_group()


def run_ranks(fn, world, case, tmpdir):
    """Run fn on `world` ranks (in-process when world == 1)."""
    if world == 1:
        fn(0, 1, case, tmpdir)
    else:
        mp.spawn(_worker, args=(world, fn, case, tmpdir), nprocs=world,
                 join=True)


# --------------------------------------------------------------------------
# Prefill and decode phases
# --------------------------------------------------------------------------

def prefill_phase(rank, world, case, tmpdir):
    """Chunked prefill of every prompt; saves this rank's cache."""
    cfg = tiny.ModelConfig(kv_heads=case["kv_heads"])
    model = tiny.TPModel(cfg, tiny.make_weights(cfg), rank, world)
    cache = tiny.PagedKVCache(cfg, model.local_kv_heads, NUM_PAGES,
                              PAGE_SIZE)
    firsts = []
    for prompt, pages in zip(PROMPTS, case["prefill_pages"]):
        pos = 0
        for chunk in chunks(prompt, NUM_CHUNKS):
            logits = model.prefill(chunk, cache, pages, start_pos=pos)
            pos += len(chunk)
        firsts.append(tiny.greedy(logits))
    torch.save({"kv_offset": model.kv_head_offset,
                "kv_count": model.local_kv_heads,
                "k": cache.k, "v": cache.v, "firsts": firsts},
               os.path.join(tmpdir, f"prefill{rank}.pt"))


def load_prefill(tmpdir, prefill_tp):
    return [torch.load(os.path.join(tmpdir, f"prefill{r}.pt"))
            for r in range(prefill_tp)]


def regroup_cache(cfg, model, sources, case, rotate=0):
    """Build this decode rank's cache from the prefill ranks' caches.

    For every global kv head h this rank owns, take it from a prefill rank
    that owns h, and copy every prompt page from its prefill page id to its
    decode page id.  rotate != 0 deliberately takes the wrong head (the
    negative control).
    """
    cache = tiny.PagedKVCache(cfg, model.local_kv_heads, NUM_PAGES,
                              PAGE_SIZE)
    for dst in range(model.local_kv_heads):
        h = (model.kv_head_offset + dst + rotate) % cfg.kv_heads
        src = next(s for s in sources
                   if s["kv_offset"] <= h < s["kv_offset"] + s["kv_count"])
        src_head = h - src["kv_offset"]
        for prompt, pp, dp in zip(PROMPTS, case["prefill_pages"],
                                  case["decode_pages"]):
            n = tiny.pages_needed(len(prompt), PAGE_SIZE)
            for sp, tp in zip(pp[:n], dp[:n]):
                for layer in range(cfg.layers):
                    cache.k[layer][tp, :, dst] = src["k"][layer][sp, :,
                                                                 src_head]
                    cache.v[layer][tp, :, dst] = src["v"][layer][sp, :,
                                                                 src_head]
    return cache


def decode_phase(rank, world, case, tmpdir):
    """Greedy decode from a regrouped cache; saves the tokens."""
    cfg = tiny.ModelConfig(kv_heads=case["kv_heads"])
    model = tiny.TPModel(cfg, tiny.make_weights(cfg), rank, world)
    sources = load_prefill(tmpdir, case["prefill_tp"])
    cache = regroup_cache(cfg, model, sources, case,
                          rotate=case.get("rotate", 0))
    outs = []
    for i, pages in enumerate(case["decode_pages"]):
        outs.append(tiny.decode_tokens(model, cache, pages,
                                       sources[0]["firsts"][i],
                                       len(PROMPTS[i]), MAX_NEW_TOKENS))
    torch.save(outs, os.path.join(tmpdir, f"decode{rank}.pt"))


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------

def disagg_case(kv_heads, prefill_tp, decode_tp, rotate=0):
    """Prefill at prefill_tp, regroup, decode at decode_tp; returns the
    tokens per prompt, after checking every rank agreed."""
    case = {"kv_heads": kv_heads, "prefill_tp": prefill_tp,
            "decode_tp": decode_tp, "rotate": rotate,
            "prefill_pages": assign_pages(PROMPTS, seed=1),
            "decode_pages": assign_pages(PROMPTS, seed=2)}
    with tempfile.TemporaryDirectory() as tmpdir:
        run_ranks(prefill_phase, prefill_tp, case, tmpdir)
        firsts = {tuple(s["firsts"]) for s in load_prefill(tmpdir,
                                                           prefill_tp)}
        run_ranks(decode_phase, decode_tp, case, tmpdir)
        outs = [torch.load(os.path.join(tmpdir, f"decode{r}.pt"))
                for r in range(decode_tp)]
    if len(firsts) != 1 or any(o != outs[0] for o in outs):
        raise RuntimeError("ranks disagree")
    return outs[0]


def single_process_case(kv_heads):
    """TP 1 prefill (2 chunks) + decode in shuffled pages, this process."""
    cfg = tiny.ModelConfig(kv_heads=kv_heads)
    model = tiny.TPModel(cfg, tiny.make_weights(cfg), 0, 1)
    cache = tiny.PagedKVCache(cfg, model.local_kv_heads, NUM_PAGES,
                              PAGE_SIZE)
    outs = []
    for prompt, pages in zip(PROMPTS, assign_pages(PROMPTS, seed=3)):
        pos = 0
        for chunk in chunks(prompt, NUM_CHUNKS):
            logits = model.prefill(chunk, cache, pages, start_pos=pos)
            pos += len(chunk)
        outs.append(tiny.decode_tokens(model, cache, pages,
                                       tiny.greedy(logits), pos,
                                       MAX_NEW_TOKENS))
    return outs


def references(kv_heads):
    cfg = tiny.ModelConfig(kv_heads=kv_heads)
    weights = tiny.make_weights(cfg)
    return [tiny.reference_generate(cfg, weights, p, MAX_NEW_TOKENS)
            for p in PROMPTS]


def report(name, got, want, expect_equal=True):
    ok = (got == want) == expect_equal
    verdict = "PASS" if ok else "FAIL"
    rel = "==" if got == want else "!="
    print(f"{verdict} {name}: generated {rel} reference; "
          f"first: {got[0]}", flush=True)
    return ok


def main():
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    t0 = time.time()
    ref8, ref2 = references(8), references(2)
    print(f"prompt lengths {[len(p) for p in PROMPTS]}; "
          f"reference (kv=8): {ref8}", flush=True)
    ok = all([
        report("(a) kv=8 prefill TP2 (2 chunks) -> decode TP4",
               disagg_case(8, 2, 4), ref8),
        report("(b) kv=2 prefill TP1 (2 chunks) -> decode TP4",
               disagg_case(2, 1, 4), ref2),
        report("(c) kv=8 TP1 prefill+decode, one process",
               single_process_case(8), ref8),
        report("(d) control: kv=8 TP2 -> TP4, heads rotated by one",
               disagg_case(8, 2, 4, rotate=1), ref8, expect_equal=False),
    ])
    print(f"{'ALL PASS' if ok else 'FAILED'} in {time.time() - t0:.1f} s",
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
