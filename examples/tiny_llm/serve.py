#!/usr/bin/python3
"""A real model served disaggregated through pdkv.sglang, checked token for token.

    examples/tiny_llm/serve.py --prefill-tp 2 --decode-tp 4 --kv-heads 8 \\
        --backend nixl --prompts 4

Prefill ranks (torch.distributed over gloo, TP = --prefill-tp) run each
prompt in chunks through the tiny GQA model (model.py), writing its KV heads
into paged pools registered with pdkv; they send the pages with pdkv.sglang's
KVSender, in the order SGLang's prefill scheduler uses. Decode ranks (TP =
--decode-tp) receive them with KVReceiver into pages of their own choosing,
read the first token from the aux row, and continue greedy decoding. The
generated tokens are compared with a single-process reference.

Prints one summary line; exits 0 only when every sequence equals the
reference. Run with Debian's Python and the package from the build tree:
    PYTHONPATH=build/python /usr/bin/python3 examples/tiny_llm/serve.py ...
"""

import argparse
import os
import queue
import random
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as tiny  # noqa: E402

PAGE_SIZE = 4
NUM_PAGES = 96  # per rank: enough for every prompt of a run at once
AUX_ROWS = 8
ROOM_BASE = 1000
POLL_DEADLINE_S = 60


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill-tp", type=int, required=True)
    parser.add_argument("--decode-tp", type=int, required=True)
    parser.add_argument("--kv-heads", type=int, required=True, help="2 or 8 (8 query heads)")
    parser.add_argument("--backend", default="nixl", help="a pdkv transport backend")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--chunk-tokens", type=int, default=2 * PAGE_SIZE,
                        help="chunked prefill: tokens per chunk (a multiple of the page "
                             "size; 0 = the whole prompt at once)")
    parser.add_argument("--timeout", type=float, default=180, help="seconds for the whole run")
    args = parser.parse_args(argv)
    if args.chunk_tokens % PAGE_SIZE:
        parser.error(f"--chunk-tokens {args.chunk_tokens} is not a multiple of the page "
                     f"size {PAGE_SIZE}")
    return args


def free_port():
    # A free port below the kernel's ephemeral range: a port bind(0) handed
    # out and we released can be taken as the source port of any connection
    # on the host (tests run side by side) before torch or the bootstrap
    # service binds it; below the range only another listener can take it.
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    low = max(1024, ephemeral_low - 12000)
    for _ in range(200):
        port = random.randrange(low, ephemeral_low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{low}, {ephemeral_low})")


# ---- what both sides share --------------------------------------------------

class Side:
    """One rank: its TP group, model shard, paged cache, aux rows and pdkv manager."""

    def __init__(self, mode, rank, run):
        from pdkv.sglang import KVArgs, KVManager
        self.rank, self.tp = rank, run["tp"][mode]
        cfg = tiny.ModelConfig(kv_heads=run["kv_heads"])
        group = dist.new_group(list(range(self.tp))) if self.tp > 1 else None
        self.group = group
        self.model = tiny.TPModel(cfg, tiny.make_weights(cfg), rank, self.tp, group)
        self.cache = tiny.PagedKVCache(cfg, self.model.local_kv_heads, NUM_PAGES, PAGE_SIZE)
        # SGLang's aux buffers: output ids (int32[16] per row), then bootstrap_room (uint64[8]).
        self.output_ids = torch.zeros(AUX_ROWS, 16, dtype=torch.int32)
        self.bootstrap_room = torch.zeros(AUX_ROWS, 8, dtype=torch.int64)
        aux = [self.output_ids, self.bootstrap_room]
        args = KVArgs()
        args.engine_rank, args.pp_rank, args.system_dp_rank, args.gpu_id = rank, 0, 0, 0
        args.prefill_start_layer, args.ib_device = 0, None
        buffers = self.cache.buffers()
        args.kv_data_ptrs = [b.data_ptr() for b in buffers]
        args.kv_data_lens = [b.numel() * b.element_size() for b in buffers]
        args.kv_item_lens = [self.cache.item_bytes()] * len(buffers)
        args.aux_data_ptrs = [a.data_ptr() for a in aux]
        args.aux_data_lens = [a.numel() * a.element_size() for a in aux]
        args.aux_item_lens = [a[0].numel() * a.element_size() for a in aux]
        args.state_types, args.state_data_ptrs = [], []
        args.kv_head_num, args.total_kv_head_num = self.model.local_kv_heads, cfg.kv_heads
        args.page_size = PAGE_SIZE
        server_args = argparse.Namespace(
            tp_size=self.tp, dp_size=1, pp_size=1, enable_dp_attention=False,
            disaggregation_bootstrap_port=run["bootstrap_port"], disaggregation_ib_device=None,
            host="127.0.0.1", dist_init_addr=None, page_size=PAGE_SIZE)
        self.manager = KVManager(args, mode, server_args)

    def poll_all_ranks(self, rooms):
        """SGLang's poll_and_all_reduce: the MIN of every rank's state, per room."""
        states = torch.tensor([int(r.poll()) for r in rooms], dtype=torch.uint8)
        if self.group is not None:
            dist.all_reduce(states, op=dist.ReduceOp.MIN, group=self.group)
        return [int(s) for s in states]

    def wait_for(self, rooms, done, what):
        deadline = time.monotonic() + POLL_DEADLINE_S
        while True:
            states = self.poll_all_ranks(rooms)
            if all(done(s) for s in states):
                return states
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: rooms still in states {states} after "
                                   f"{POLL_DEADLINE_S} s")
            for engine in self.manager.engines():
                engine.wait_for_changes(0.01)


def page_lists(sizes, seed):
    """Each request's pages from one shuffled pool: the same on every rank of a side."""
    free = list(range(NUM_PAGES))
    random.Random(seed).shuffle(free)
    lists, start = [], 0
    for size in sizes:
        lists.append(free[start:start + size])
        start += size
    return lists


# ---- prefill ------------------------------------------------------------------

def prefill_rank(rank, run):
    from pdkv.sglang import KVBootstrapServer, KVPoll, KVSender
    bootstrap = KVBootstrapServer("127.0.0.1", run["bootstrap_port"]) if rank == 0 else None
    dist.barrier()  # the bootstrap service is up before any rank registers
    side = Side("prefill", rank, run)
    prompts = run["prompts"]
    pages = page_lists([tiny.pages_needed(len(p), PAGE_SIZE) for p in prompts], seed=7)
    addr = f"127.0.0.1:{run['bootstrap_port']}"
    # prefill.py: PrefillBootstrapQueue.add creates a sender per request on arrival.
    senders = [KVSender(side.manager, addr, ROOM_BASE + i, [rank], 0) for i in range(len(prompts))]
    # pop_bootstrapped: until the decode's metadata reached every rank.
    side.wait_for(senders, lambda s: s != KVPoll.Bootstrapping, "prefill bootstrap")
    for i, (prompt, sender) in enumerate(zip(prompts, senders)):
        assert sender.pop_decode_prefix_len() == 0
        sender.init(len(pages[i]), i % AUX_ROWS)  # finalize_bootstrap: pages and aux row
        run_prefill(side, sender, prompt, pages[i], i % AUX_ROWS, ROOM_BASE + i,
                    run["chunk_tokens"])
    states = side.wait_for(senders, lambda s: s in (KVPoll.Success, KVPoll.Failed),
                           "prefill transfer")
    for sender in senders:
        sender.clear()
    dist.barrier()  # every rank's sends are done before the service goes
    if bootstrap is not None:
        run["results"].put(("prefill", states))
        run["done"].wait(POLL_DEADLINE_S * 2)  # decode still looks up peers until it ends
        bootstrap.close()


def run_prefill(side, sender, prompt, pages, aux_row, room, chunk_tokens):
    """Chunked prefill as SGLang's send_kv_chunk: whole pages after each chunk, the
    partial last page and the aux row with the last."""
    chunk = chunk_tokens or len(prompt)
    sent_pages, start = 0, 0
    while start < len(prompt):
        end = min(start + chunk, len(prompt))
        logits = side.model.prefill(prompt[start:end], side.cache, pages, start_pos=start)
        last = end == len(prompt)
        upto = len(pages) if last else end // PAGE_SIZE
        if last:
            side.output_ids[aux_row, 0] = tiny.greedy(logits)
            side.bootstrap_room[aux_row, 0] = room
        chunk_pages = pages[sent_pages:upto]
        if sender.should_send_kv_chunk(len(chunk_pages), last):
            sender.send(torch.tensor(chunk_pages, dtype=torch.int64).numpy())
        sent_pages, start = upto, end


# ---- decode -------------------------------------------------------------------

def decode_rank(rank, run):
    from pdkv.sglang import KVPoll, KVReceiver
    dist.barrier()
    side = Side("decode", rank, run)
    prompts, new = run["prompts"], run["new_tokens"]
    pages = page_lists([tiny.pages_needed(len(p) + new, PAGE_SIZE) for p in prompts], seed=99)
    addr = f"127.0.0.1:{run['bootstrap_port']}"
    # decode.py: DecodePreallocQueue.add, then init(prefill_dp_rank).
    receivers = [KVReceiver(side.manager, addr, ROOM_BASE + i) for i in range(len(prompts))]
    for receiver in receivers:
        receiver.init(0)
    side.wait_for(receivers, lambda s: s != KVPoll.Bootstrapping, "decode bootstrap")
    rows = [(AUX_ROWS - 1 - i) % AUX_ROWS for i in range(len(prompts))]
    for i, receiver in enumerate(receivers):  # pop_preallocated
        prompt_pages = pages[i][:tiny.pages_needed(len(prompts[i]), PAGE_SIZE)]
        receiver.send_metadata(torch.tensor(prompt_pages, dtype=torch.int32).numpy(), rows[i],
                               None, decode_prefix_len=0)
    states = side.wait_for(receivers, lambda s: s in (KVPoll.Success, KVPoll.Failed),
                           "decode transfer")
    outputs = []
    for i, (receiver, state) in enumerate(zip(receivers, states)):
        if state != KVPoll.Success:
            try:
                receiver.failure_exception()
            except Exception as error:  # SGLang logs it and aborts the request
                outputs.append(f"failed: {error}")
            continue
        if int(side.bootstrap_room[rows[i], 0]) != ROOM_BASE + i:
            outputs.append(f"aux row names room {int(side.bootstrap_room[rows[i], 0])}")
            continue
        first = int(side.output_ids[rows[i], 0])
        outputs.append(tiny.decode_tokens(side.model, side.cache, pages[i], first,
                                          len(prompts[i]), new))
        receiver.clear()
    if rank == 0:
        run["results"].put(("decode", outputs))


# ---- processes ------------------------------------------------------------------

def rank_main(rank, mode, run):
    torch.set_num_threads(1)
    os.environ.setdefault("SPDLOG_LEVEL", "warn")
    os.environ["PDKV_TRANSPORT"] = run["backend"]
    os.environ["PDKV_KV_MEMORY"] = "host"
    os.environ["PDKV_ENGINE_ID"] = mode
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{run['dist_port'][mode]}",
                            rank=rank, world_size=run["tp"][mode])
    try:
        (prefill_rank if mode == "prefill" else decode_rank)(rank, run)
    except Exception as error:
        run["results"].put(("error", f"{mode} rank {rank}: {type(error).__name__}: {error}"))
        raise


def first_difference(outputs, reference):
    for i, (got, want) in enumerate(zip(outputs, reference)):
        if isinstance(got, str):
            return f"sequence {i}: {got}"
        for j, (g, w) in enumerate(zip(got, want)):
            if g != w:
                return f"sequence {i} token {j}: {g} != reference {w}"
    return None


def main(argv=None):
    args = parse_args(argv)
    cfg = tiny.ModelConfig(kv_heads=args.kv_heads)
    prompts = tiny.make_prompts(args.prompts, seed=42, min_len=5, max_len=20)
    weights = tiny.make_weights(cfg)
    reference = [tiny.reference_generate(cfg, weights, p, args.new_tokens) for p in prompts]

    ctx = mp.get_context("spawn")
    run = {"tp": {"prefill": args.prefill_tp, "decode": args.decode_tp},
           "kv_heads": args.kv_heads, "backend": args.backend, "prompts": prompts,
           "new_tokens": args.new_tokens, "chunk_tokens": args.chunk_tokens,
           "bootstrap_port": free_port(),
           "dist_port": {"prefill": free_port(), "decode": free_port()},
           "results": ctx.Queue(), "done": ctx.Event()}
    workers = [ctx.Process(target=rank_main, args=(r, mode, run), daemon=True)
               for mode in ("prefill", "decode") for r in range(run["tp"][mode])]
    for w in workers:
        w.start()
    outputs, error = None, None
    deadline = time.monotonic() + args.timeout
    try:
        while outputs is None and error is None:
            try:
                kind, value = run["results"].get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                error = f"no result within {args.timeout} s"
                break
            if kind == "decode":
                outputs = value
            elif kind == "error":
                error = value
    finally:
        run["done"].set()
        for w in workers:
            w.join(timeout=max(deadline - time.monotonic(), 5))
        for w in workers:  # a rank that did not end is ended, by pid
            if w.is_alive():
                w.kill()
                w.join()

    head = (f"tiny_llm {args.backend} prefill TP {args.prefill_tp} -> decode TP "
            f"{args.decode_tp}, {args.kv_heads} KV heads:")
    if error is not None:
        print(f"{head} sequences {len(prompts)}, tokens 0, equal no, first difference: {error}")
        return 1
    difference = first_difference(outputs, reference)
    tokens = sum(len(o) for o in outputs if not isinstance(o, str))
    print(f"{head} sequences {len(outputs)}, tokens {tokens}, "
          f"equal {'no' if difference else 'yes'}"
          + (f", first difference: {difference}" if difference else ""))
    return 1 if difference or len(outputs) != len(prompts) else 0


if __name__ == "__main__":
    sys.exit(main())
