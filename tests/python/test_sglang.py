"""pdkv.sglang driven as SGLang's schedulers drive a transfer backend.

The call order follows SGLang at 0094505d (docs/integration.md, "SGLang"):
  prefill  disaggregation/prefill.py: PrefillBootstrapQueue.add -> KVSender(...);
           pop_bootstrapped polls until WaitingForInput, then
           pop_decode_prefix_len() and init(num_pages, metadata_buffer_index);
           send_kv_chunk sends page indices per chunk (no is_last: the sender
           counts); process_disagg_prefill_inflight_queue polls, then clear()
           and get_transfer_metric()
  decode   disaggregation/decode.py: DecodePreallocQueue.add -> KVReceiver(...),
           init(prefill_dp_rank); pop_preallocated: send_metadata(int32 page
           indices, aux index, None, decode_prefix_len); pop_transferred polls,
           then clear()
Expected bytes come from numpy's own indexing of the buffers."""

import time
import types

import numpy as np
import pdkv
import pytest

from conftest import BACKENDS
from pdkv import PdkvError
from pdkv.sglang import (KVArgs, KVBootstrapServer, KVManager, KVPoll, KVReceiver, KVSender,
                         KVTransferError, UnsupportedByPdkv)

LAYERS, PAGES, PAGE_SIZE, HEAD_BYTES = 2, 16, 4, 16
AUX_ITEMS = [8, 32]  # e.g. output ids, then a bootstrap_room row
AUX_SLOTS = 4


def server_args(port, tp_size=1, **overrides):
    fields = dict(tp_size=tp_size, dp_size=1, pp_size=1, enable_dp_attention=False,
                  disaggregation_bootstrap_port=port, disaggregation_ib_device=None,
                  host="127.0.0.1", dist_init_addr=None, page_size=PAGE_SIZE)
    fields.update(overrides)
    return types.SimpleNamespace(**fields)


class Rank:
    """One rank's SGLang-style buffers: KV [page][token][head][bytes] per layer, K then V."""

    def __init__(self, total_heads, tp_size, tp_rank, seed):
        self.heads = max(total_heads // tp_size, 1)
        item = PAGE_SIZE * self.heads * HEAD_BYTES
        rng = np.random.default_rng(seed)
        self.kv = [rng.integers(0, 256, PAGES * item, dtype=np.uint8) for _ in range(2 * LAYERS)]
        self.aux = [rng.integers(0, 256, AUX_SLOTS * n, dtype=np.uint8) for n in AUX_ITEMS]
        args = KVArgs()
        args.engine_rank = tp_rank
        args.kv_data_ptrs = [b.ctypes.data for b in self.kv]
        args.kv_data_lens = [b.nbytes for b in self.kv]
        args.kv_item_lens = [item] * len(self.kv)
        args.aux_data_ptrs = [b.ctypes.data for b in self.aux]
        args.aux_data_lens = [b.nbytes for b in self.aux]
        args.aux_item_lens = list(AUX_ITEMS)
        args.state_types, args.state_data_ptrs = [], []
        args.kv_head_num, args.total_kv_head_num = self.heads, total_heads
        args.page_size, args.prefill_start_layer, args.pp_rank = PAGE_SIZE, 0, 0
        args.system_dp_rank, args.gpu_id, args.ib_device = 0, 0, None
        self.args = args

    def page(self, buffer, page):
        return self.kv[buffer].reshape(PAGES, PAGE_SIZE, self.heads, HEAD_BYTES)[page]


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("PDKV_KV_MEMORY", "host")
    monkeypatch.setenv("PDKV_TRANSPORT", "mooncake")
    return monkeypatch


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_prefill(env, total_heads, tp, seed=1):
    """A prefill server; the caller keeps the ranks (their buffers) alive, as SGLang does."""
    port = free_port()
    bootstrap = KVBootstrapServer("127.0.0.1", port)  # disagg_service.start_disagg_service
    ranks = [Rank(total_heads, tp, r, seed + r) for r in range(tp)]
    env.setenv("PDKV_ENGINE_ID", "prefill")
    managers = [KVManager(r.args, "prefill", server_args(port, tp)) for r in ranks]
    return bootstrap, ranks, managers, f"127.0.0.1:{port}"


def serve_decode(env, total_heads, tp, name="decode-a"):
    ranks = [Rank(total_heads, tp, r, 100 + r) for r in range(tp)]
    env.setenv("PDKV_ENGINE_ID", name)
    managers = [KVManager(r.args, types.SimpleNamespace(value="decode"), server_args(1, tp))
                for r in ranks]
    return ranks, managers


_deadline = [0.0]


@pytest.fixture(autouse=True)
def bounded_polling():
    """Every test's poll loops end within 30 s: a room that never gets there fails it."""
    _deadline[0] = time.monotonic() + 30


def poll_all(rooms, engines):
    """SGLang all-reduces the ranks' polls with MIN: the least advanced state wins."""
    if time.monotonic() > _deadline[0]:
        raise AssertionError("the rooms did not reach the awaited state within 30 s: "
                             + ", ".join(str(int(r.poll())) for r in rooms))
    for engine in engines:
        engine.wait_for_changes(0.02)
    return min(int(r.poll()) for r in rooms)


def engines_of(*manager_lists):
    return [e for ms in manager_lists for m in ms for e in m.engines()]


def run_request(p_mgrs, d_mgrs, addr, room, src_pages, dst_pages, chunks, aux=(1, 2),
                prefix_tokens=0):
    """One request through SGLang's calls; returns the senders and receivers."""
    engines = engines_of(p_mgrs, d_mgrs)
    senders = [KVSender(m, addr, room, [m.tp_rank], 0) for m in p_mgrs]
    receivers = [KVReceiver(m, addr, room) for m in d_mgrs]
    assert poll_all(receivers, engines) == KVPoll.Bootstrapping
    for r in receivers:
        r.init(0)
    while poll_all(receivers, engines) == KVPoll.Bootstrapping:
        pass
    for r in receivers:
        r.send_metadata(np.array(dst_pages, dtype=np.int32), aux[1], None,
                        decode_prefix_len=prefix_tokens)
    while poll_all(senders, engines) == KVPoll.Bootstrapping:
        pass
    assert poll_all(senders, engines) == KVPoll.WaitingForInput
    for s in senders:
        assert s.pop_decode_prefix_len() == prefix_tokens
        s.init(len(src_pages), aux[0])
    start = 0
    for index, end in enumerate(chunks):
        for s in senders:
            pages = np.array(src_pages[start:end], dtype=np.int64)
            if s.should_send_kv_chunk(len(pages), index == len(chunks) - 1):
                s.send(pages)
        start = end
    while poll_all(senders + receivers, engines) not in (KVPoll.Success, KVPoll.Failed):
        pass
    return senders, receivers


def check_pages(p_ranks, d_ranks, total_heads, src_pages, dst_pages):
    """Every decode head equals the prefill rank's that owns it (by hand: global heads)."""
    def owner(ranks, head):
        per = ranks[0].heads
        return next((r, head % per) for i, r in enumerate(ranks)
                    if head // per == i or (per == 1 and len(ranks) > total_heads
                                            and i // (len(ranks) // total_heads) == head))
    for d_index, d in enumerate(d_ranks):
        if d.heads == 1 and len(d_ranks) > total_heads:
            d_heads = [d_index // (len(d_ranks) // total_heads)]
        else:
            d_heads = list(range(d_index * d.heads, (d_index + 1) * d.heads))
        for local, head in enumerate(d_heads):
            src, src_local = owner(p_ranks, head)
            for b in range(2 * LAYERS):
                for sp, dp in zip(src_pages, dst_pages):
                    np.testing.assert_array_equal(d.page(b, dp)[:, local],
                                                  src.page(b, sp)[:, src_local])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_chunked_request_lands_whole_with_its_aux_row(env, backend):
    env.setenv("PDKV_TRANSPORT", backend)
    bootstrap, p_ranks, p_mgrs, addr = serve_prefill(env, total_heads=2, tp=1)
    d_ranks, d_mgrs = serve_decode(env, total_heads=2, tp=1)
    src, dst = [5, 0, 9, 3, 12], [1, 14, 7, 2, 8]
    senders, receivers = run_request(p_mgrs, d_mgrs, addr, 7, src, dst, chunks=[2, 4, 5])
    assert [int(r.poll()) for r in receivers] == [KVPoll.Success]
    check_pages(p_ranks, d_ranks, 2, src, dst)
    for p_buf, d_buf, n in zip(p_ranks[0].aux, d_ranks[0].aux, AUX_ITEMS):
        np.testing.assert_array_equal(d_buf[2 * n:3 * n], p_buf[1 * n:2 * n])
    metric = senders[0].get_transfer_metric()
    for s in senders + receivers:
        s.clear()
    kv_bytes = 5 * 2 * LAYERS * PAGE_SIZE * 2 * HEAD_BYTES
    assert metric.transfer_total_bytes == kv_bytes + sum(AUX_ITEMS)
    assert metric.transfer_latency_s > 0
    assert int(senders[0].poll()) == KVPoll.Success  # still answers after clear()
    bootstrap.close()


def test_with_a_secret_file_the_cluster_is_authenticated_and_moves_requests(env, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef0123456789abcdef\n")
    secret.chmod(0o600)
    env.setenv("PDKV_SECRET_FILE", str(secret))
    bootstrap, p_ranks, p_mgrs, addr = serve_prefill(env, total_heads=2, tp=1)
    d_ranks, d_mgrs = serve_decode(env, total_heads=2, tp=1)
    src, dst = [4, 6], [9, 1]
    _, receivers = run_request(p_mgrs, d_mgrs, addr, 11, src, dst, chunks=[2])
    assert [int(r.poll()) for r in receivers] == [KVPoll.Success]
    check_pages(p_ranks, d_ranks, 2, src, dst)
    # A client without the secret gets nothing from this bootstrap service.
    host, port = addr.rsplit(":", 1)
    env.delenv("PDKV_SECRET_FILE")
    with pytest.raises(PdkvError, match="unauthenticated"):
        pdkv.Engine({"role": "decode", "engine_id": "outsider", "backend": "mooncake",
                     "bootstrap_address": f"{host}:{port}", "kv_heads": 2, "head_dim": 4,
                     "dtype_bytes": 2, "page_size": 4, "num_layers": 2, "num_pages": 4,
                     "timeout_bootstrap_ms": 2000})
    bootstrap.close()


@pytest.mark.parametrize("p_tp,d_tp,heads", [(2, 4, 8), (4, 2, 8), (1, 4, 2)])
def test_heterogeneous_tp_sends_each_decode_rank_its_heads(env, p_tp, d_tp, heads):
    bootstrap, p_ranks, p_mgrs, addr = serve_prefill(env, heads, p_tp)
    d_ranks, d_mgrs = serve_decode(env, heads, d_tp)
    src, dst = [3, 8, 1], [0, 4, 11]
    _, receivers = run_request(p_mgrs, d_mgrs, addr, 9, src, dst, chunks=[3])
    assert all(int(r.poll()) == KVPoll.Success for r in receivers)
    check_pages(p_ranks, d_ranks, heads, src, dst)
    bootstrap.close()


def test_mla_pools_arrive_whole_at_every_decode_rank(env):
    # MLA: one latent buffer per layer, the same on every prefill rank (SGLang
    # replicates it over TP), so each decode rank must hold the prefill's pages.
    port = free_port()
    bootstrap = KVBootstrapServer("127.0.0.1", port)
    env.setenv("PDKV_ENGINE_ID", "prefill")
    p_ranks = [Rank(1, 1, r, seed=5) for r in range(2)]
    d_ranks = [Rank(1, 1, r, seed=60 + r) for r in range(4)]
    for ranks in (p_ranks, d_ranks):
        for r in ranks:
            r.kv = r.kv[:LAYERS]  # one buffer per layer
            r.args.kv_data_ptrs = r.args.kv_data_ptrs[:LAYERS]
            r.args.kv_data_lens = r.args.kv_data_lens[:LAYERS]
            r.args.kv_item_lens = r.args.kv_item_lens[:LAYERS]
    p_mgrs = [KVManager(r.args, "prefill", server_args(port, 2), is_mla_backend=True)
              for r in p_ranks]
    env.setenv("PDKV_ENGINE_ID", "decode-mla")
    d_mgrs = [KVManager(r.args, "decode", server_args(1, 4), is_mla_backend=True)
              for r in d_ranks]
    _, receivers = run_request(p_mgrs, d_mgrs, f"127.0.0.1:{port}", 13, [2, 9], [6, 1],
                               chunks=[2])
    assert all(int(r.poll()) == KVPoll.Success for r in receivers)
    for d in d_ranks:
        for b in range(LAYERS):
            for sp, dp in zip([2, 9], [6, 1]):
                np.testing.assert_array_equal(d.page(b, dp), p_ranks[0].page(b, sp))
    bootstrap.close()


def test_an_empty_last_chunk_still_completes_the_request(env):
    bootstrap, p_ranks, p_mgrs, addr = serve_prefill(env, 2, 1)
    d_ranks, d_mgrs = serve_decode(env, 2, 1)
    _, receivers = run_request(p_mgrs, d_mgrs, addr, 11, [4, 6], [2, 3], chunks=[2, 2])
    assert int(receivers[0].poll()) == KVPoll.Success
    bootstrap.close()


def test_a_decode_prefix_is_not_sent(env):
    bootstrap, p_ranks, p_mgrs, addr = serve_prefill(env, 2, 1)
    d_ranks, d_mgrs = serve_decode(env, 2, 1)
    before = d_ranks[0].kv[0].copy()
    # 1 page (4 tokens) of the request is cached at decode: 2 pages move.
    _, receivers = run_request(p_mgrs, d_mgrs, addr, 12, [7, 9], [5, 6], chunks=[2],
                               prefix_tokens=PAGE_SIZE)
    assert int(receivers[0].poll()) == KVPoll.Success
    check_pages(p_ranks, d_ranks, 2, [7, 9], [5, 6])
    untouched = [p for p in range(PAGES) if p not in (5, 6)]
    np.testing.assert_array_equal(d_ranks[0].kv[0].reshape(PAGES, -1)[untouched],
                                  before.reshape(PAGES, -1)[untouched])
    bootstrap.close()


def test_one_decode_server_is_fed_by_two_prefill_servers(env):
    first = serve_prefill(env, 2, 1, seed=1)
    second = serve_prefill(env, 2, 1, seed=50)
    d_ranks, d_mgrs = serve_decode(env, 2, 1)
    for (bootstrap, p_ranks, p_mgrs, addr), room, dst in ((first, 21, [0, 1]),
                                                           (second, 22, [2, 3])):
        _, receivers = run_request(p_mgrs, d_mgrs, addr, room, [8, 9], dst, chunks=[2])
        assert int(receivers[0].poll()) == KVPoll.Success, room
        check_pages(p_ranks, d_ranks, 2, [8, 9], dst)
    assert len(d_mgrs[0].engines()) == 2  # one engine per prefill bootstrap service
    first[0].close()
    second[0].close()


def test_a_decode_abort_fails_the_prefill_with_a_kv_transfer_error(env):
    bootstrap, p_ranks, p_mgrs, addr = serve_prefill(env, 2, 1)
    d_ranks, d_mgrs = serve_decode(env, 2, 1)
    engines = engines_of(p_mgrs, d_mgrs)
    sender = KVSender(p_mgrs[0], addr, 31, [0], 0)
    receiver = KVReceiver(d_mgrs[0], addr, 31)
    receiver.init(0)
    while poll_all([receiver], engines) == KVPoll.Bootstrapping:
        pass
    receiver.send_metadata(np.array([1, 2], dtype=np.int32), 0)
    while poll_all([sender], engines) == KVPoll.Bootstrapping:
        pass
    receiver.abort()  # SGLang's abort handling
    # Failed only once pdkv says so (no source writes into the pages any
    # more): SGLang frees the request's pages when it sees Failed.
    while poll_all([receiver], engines) != KVPoll.Failed:
        pass
    assert int(receiver._room.poll()) == KVPoll.Failed
    while poll_all([sender], engines) != KVPoll.Failed:
        pass
    with pytest.raises(KVTransferError) as error:
        sender.failure_exception()
    assert "Aborted by AbortReq." in str(error.value)
    assert error.value.bootstrap_room == 31 and not error.value.is_from_another_rank
    bootstrap.close()


def test_what_the_adapter_cannot_do_is_refused_by_name(env, tmp_path):
    rank = Rank(2, 1, 0, 1)
    with pytest.raises(UnsupportedByPdkv, match="enable_dp_attention"):
        KVManager(rank.args, "decode", server_args(1, enable_dp_attention=True))
    with pytest.raises(UnsupportedByPdkv, match="pp_size=2"):
        KVManager(rank.args, "decode", server_args(1, pp_size=2))
    with pytest.raises(UnsupportedByPdkv, match="disaggregation_ib_device"):
        KVManager(rank.args, "decode", server_args(1, disaggregation_ib_device="mlx5_0"))
    rank.args.state_types = ["mamba"]
    with pytest.raises(UnsupportedByPdkv, match="state_types"):
        KVManager(rank.args, "decode", server_args(1))
    rank.args.state_types = []
    with pytest.raises(ValueError, match="neither prefill nor decode"):
        KVManager(rank.args, "null", server_args(1))
    loose = tmp_path / "secret"
    loose.write_text("a-secret-of-more-than-16-bytes\n")
    loose.chmod(0o644)
    env.setenv("PDKV_SECRET_FILE", str(loose))
    with pytest.raises(PdkvError, match=f"secret file '{loose}' is open to other users"):
        KVManager(rank.args, "decode", server_args(1))
    env.delenv("PDKV_SECRET_FILE")
    rank.args.kv_head_num = 2
    with pytest.raises(ValueError, match="kv_head_num=2"):
        KVManager(rank.args, "decode", server_args(1, tp_size=2))
    manager = KVManager(rank.args, "decode", server_args(1))
    receiver = KVReceiver(manager, "127.0.0.1:1", 5)
    with pytest.raises(UnsupportedByPdkv, match="state_indices"):
        receiver.send_metadata(np.array([1], dtype=np.int32), 0, [[3]])
    with pytest.raises(UnsupportedByPdkv, match="decode_prefix_len=3"):
        receiver.send_metadata(np.array([1], dtype=np.int32), 0, None, decode_prefix_len=3)


def test_the_plugin_answers_pdkv_classes_for_the_replaced_backend_only():
    from pdkv.sglang import plugin
    hook = plugin.around_get_kv_class("mooncake")
    original = lambda backend, kind: ("sglang", backend, kind)  # noqa: E731
    mooncake = types.SimpleNamespace(value="mooncake")
    assert hook(original, mooncake, types.SimpleNamespace(value="sender")) is KVSender
    assert hook(original, "mooncake", "manager") is KVManager
    assert hook(original, "nixl", "sender") == ("sglang", "nixl", "sender")
