"""pdkv's Python API over the C ABI: a room moved over every backend with
the caller's numpy arrays or torch tensors as pools, every byte checked
against numpy's own indexing; errors as PdkvError; what memory is accepted."""

import ctypes
import subprocess
import sys

import numpy as np
import pytest

import pdkv
from conftest import BACKENDS, ended, wait_until

SHAPE = dict(kv_heads=2, head_dim=4, dtype_bytes=2, page_size=2, num_layers=2, num_pages=8)
PAGE_BYTES = 2 * 2 * 4 * 2  # page_size * heads * head_dim * dtype bytes


def engines(bootstrap, backend, prefill_pools=None, decode_pools=None):
    base = dict(SHAPE, backend=backend, bootstrap_address=bootstrap)
    prefill = pdkv.Engine(dict(base, role="prefill", engine_id="p"), prefill_pools)
    decode = pdkv.Engine(dict(base, role="decode", engine_id="d"), decode_pools)
    return prefill, decode


def move(prefill, decode, room, src_pages, dst_pages):
    sender = prefill.sender(room)
    receiver = decode.receiver(room, "p")
    receiver.init()
    receiver.send_metadata(dst_pages)
    sender.init(len(src_pages))
    wait_until([prefill], lambda: sender.poll() != pdkv.PollState.Bootstrapping)
    sender.send(src_pages, is_last=True)
    wait_until([prefill, decode], lambda: ended(sender, receiver))
    return sender, receiver


@pytest.mark.parametrize("backend", BACKENDS)
def test_numpy_pools_receive_exactly_the_pages_sent(bootstrap, backend):
    rng = np.random.default_rng(7)
    src = [rng.integers(0, 256, 8 * PAGE_BYTES, dtype=np.uint8) for _ in range(4)]
    dst = [np.zeros(8 * PAGE_BYTES, np.uint8) for _ in range(4)]
    prefill, decode = engines(bootstrap, backend, {"kv": src}, {"kv": dst})
    sender, receiver = move(prefill, decode, 1, [6, 0, 3], [1, 7, 4])
    assert receiver.poll() == pdkv.PollState.Success, receiver.failure()
    assert sender.poll() == pdkv.PollState.Success, sender.failure()
    for s, d in zip(src, dst):
        pages_src, pages_dst = s.reshape(8, PAGE_BYTES), d.reshape(8, PAGE_BYTES)
        np.testing.assert_array_equal(pages_dst[[1, 7, 4]], pages_src[[6, 0, 3]])
        untouched = [p for p in range(8) if p not in (1, 7, 4)]
        assert not pages_dst[untouched].any(), "bytes landed outside the room's pages"
    assert receiver.metrics()["bytes"] == 3 * PAGE_BYTES * 4


def test_torch_tensors_are_pools_by_their_data_pointer(bootstrap):
    torch = pytest.importorskip("torch")
    # K/V of 2 layers, [page][token][head][dim] in float16, as SGLang lays them out.
    src = [torch.randn(8, 2, 2, 4, dtype=torch.float16) for _ in range(4)]
    dst = [torch.zeros(8, 2, 2, 4, dtype=torch.float16) for _ in range(4)]
    prefill, decode = engines(bootstrap, "mooncake", {"kv": src}, {"kv": dst})
    _, receiver = move(prefill, decode, 2, [5, 2], [0, 6])
    assert receiver.poll() == pdkv.PollState.Success, receiver.failure()
    for s, d in zip(src, dst):
        assert torch.equal(d[[0, 6]], s[[5, 2]])


def test_allocated_pools_are_readable_through_host_views(bootstrap):
    prefill, decode = engines(bootstrap, "mooncake")
    src_regions, dst_regions = prefill.regions("kv"), decode.regions("kv")
    assert len(src_regions) == 4 and all(r.length == 8 * PAGE_BYTES for r in src_regions)
    for i, region in enumerate(src_regions):
        prefill.host_view(region)[:] = bytes((i * 31 + b) % 256 for b in range(region.length))
    _, receiver = move(prefill, decode, 3, [2], [5])
    assert receiver.poll() == pdkv.PollState.Success, receiver.failure()
    for i, region in enumerate(dst_regions):
        got = bytes(decode.host_view(region)[5 * PAGE_BYTES:6 * PAGE_BYTES])
        assert got == bytes((i * 31 + b) % 256 for b in range(2 * PAGE_BYTES, 3 * PAGE_BYTES))


def test_many_rooms_are_polled_at_once(bootstrap):
    prefill, decode = engines(bootstrap, "mooncake")
    receivers = [decode.receiver(room, "p") for room in (10, 11)]
    for r in receivers:
        r.init()
    wait_until([decode], lambda: all(r.poll() == pdkv.PollState.WaitingForInput
                                     for r in receivers))
    assert decode.poll([10, 11, 12]) == [pdkv.PollState.WaitingForInput,
                                         pdkv.PollState.WaitingForInput, pdkv.PollState.Failed]


def test_errors_carry_the_code_and_name_the_value(bootstrap):
    with pytest.raises(pdkv.PdkvError) as error:
        pdkv.Engine(dict(SHAPE, backend="mooncake", page_size="sixteen"))
    assert error.value.code == pdkv.StatusCode.INVALID_ARGUMENT
    assert "'sixteen' for page_size" in error.value.message
    prefill, _ = engines(bootstrap, "mooncake")
    first = prefill.sender(4)
    with pytest.raises(pdkv.PdkvError) as error:
        prefill.sender(4)
    assert error.value.code == pdkv.StatusCode.ALREADY_EXISTS
    first.close()
    sender = prefill.sender(5)
    sender.close()
    with pytest.raises(pdkv.PdkvError) as error:
        sender.poll()
    assert error.value.code == pdkv.StatusCode.FAILED_PRECONDITION


def test_a_sender_outlives_its_engine(bootstrap):
    prefill, _ = engines(bootstrap, "mooncake")
    sender = prefill.sender(6)
    prefill.close()
    assert sender.poll() == pdkv.PollState.Failed
    assert "shut down" in sender.failure().message


def test_memory_that_cannot_be_registered_is_refused_by_what_it_is():
    with pytest.raises(ValueError, match="not contiguous"):
        pdkv.region_of(np.zeros((4, 4), np.uint8)[:, 1])
    with pytest.raises(ValueError, match="read-only"):
        pdkv.region_of(b"abc")
    with pytest.raises(TypeError, match="int is no memory"):
        pdkv.region_of(42)
    with pytest.raises(ValueError, match="memory kind 'tpu'"):
        pdkv.Region(1, 1, "tpu").to_c()


def test_cuda_array_interface_objects_are_gpu_regions():
    class FakeDeviceArray:
        __cuda_array_interface__ = {"data": (0x7000, False), "shape": (3, 5),
                                    "typestr": "<f2", "strides": None, "version": 3}
    region = pdkv.region_of(FakeDeviceArray(), device=2)
    assert region == pdkv.Region(0x7000, 30, "cuda", 2)

    class Strided(FakeDeviceArray):
        __cuda_array_interface__ = dict(FakeDeviceArray.__cuda_array_interface__,
                                        strides=(20, 2))
    with pytest.raises(ValueError, match="not C-contiguous"):
        pdkv.region_of(Strided())


def test_numpy_callers_do_not_import_torch():
    code = ("import sys, numpy, pdkv; pdkv.region_of(numpy.zeros(8, numpy.uint8)); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_calls_release_the_gil():
    # A ctypes.CDLL call drops the GIL for its duration; a PyDLL one keeps it.
    flags = pdkv._native.lib._func_flags_
    assert not flags & ctypes._FUNCFLAG_PYTHONAPI
