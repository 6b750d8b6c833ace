"""Memory a pdkv engine registers, from whatever the caller holds.

Accepted, without importing torch or numpy unless the caller passes one:
  - a Region (a raw pointer and length, e.g. SGLang's kv_data_ptrs)
  - a torch tensor: data_ptr(), its bytes, its device (cpu or cuda:N)
  - an object with __cuda_array_interface__ (CuPy, Numba, ...): GPU memory
  - anything with the writable buffer protocol (numpy arrays, bytearray)
Each must be one contiguous block: pdkv registers it once and writes into it.
"""

import ctypes
from dataclasses import dataclass

from pdkv import _native

# pdkv_memory_kind's numbers by name; "cpu" is torch's word for host memory.
_KINDS = {"host": 0, "cpu": 0, "cuda": 1, "hip": 2}
_KIND_NAMES = {0: "host", 1: "cuda", 2: "hip"}


@dataclass(frozen=True)
class Region:
    """One block of memory: its address, bytes, kind ("host", "cuda", "hip") and device."""
    base: int
    length: int
    kind: str = "host"
    device: int = 0

    def to_c(self):
        if self.kind not in _KINDS:
            raise ValueError(f"memory kind {self.kind!r} is none of host, cuda, hip")
        return _native.Region(self.base, self.length, _KINDS[self.kind], self.device)

    @staticmethod
    def from_c(region):
        return Region(region.base or 0, region.length, _KIND_NAMES[region.kind], region.device)


def _is_torch_tensor(obj):
    # Looking at the type's module keeps torch unimported for other callers.
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _from_torch(tensor):
    if not tensor.is_contiguous():
        raise ValueError(f"a torch tensor of shape {tuple(tensor.shape)} is not contiguous")
    device = tensor.device
    if device.type == "cpu":
        kind, index = "host", 0
    elif device.type == "cuda":
        # ROCm builds of torch name their devices "cuda" too.
        kind = "hip" if getattr(getattr(__import__("torch"), "version", None), "hip", None) \
            else "cuda"
        index = device.index or 0
    else:
        raise ValueError(f"a torch tensor on device {device} is neither cpu nor cuda memory")
    return Region(tensor.data_ptr(), tensor.numel() * tensor.element_size(), kind, index)


def _from_cuda_array_interface(obj, device):
    iface = obj.__cuda_array_interface__
    pointer, readonly = iface["data"]
    if readonly:
        raise ValueError("a read-only __cuda_array_interface__ buffer cannot be written into")
    shape = iface["shape"]
    itemsize = int(iface["typestr"][2:])
    strides = iface.get("strides")
    count = 1
    for extent in shape:
        count *= extent
    if strides is not None:
        expected, step = [], itemsize
        for extent in reversed(shape):
            expected.insert(0, step)
            step *= extent
        if tuple(strides) != tuple(expected):
            raise ValueError(f"a __cuda_array_interface__ buffer with strides {strides} "
                             f"is not C-contiguous (expected {tuple(expected)})")
    if device is None:
        device = getattr(getattr(obj, "device", None), "id", 0)
    return Region(pointer, count * itemsize, "cuda", device)


def _from_buffer(obj):
    view = memoryview(obj)
    if not view.contiguous:
        raise ValueError("a buffer that is not contiguous cannot be registered")
    if view.readonly:
        raise ValueError(f"a read-only buffer ({type(obj).__name__}) cannot be written into")
    if view.nbytes == 0:
        raise ValueError(f"an empty buffer ({type(obj).__name__}) cannot be registered")
    array = (ctypes.c_char * view.nbytes).from_buffer(view.cast("B"))
    return Region(ctypes.addressof(array), view.nbytes, "host", 0)


def region_of(obj, device=None):
    """The Region of `obj` (see the module's list). The caller keeps `obj` alive."""
    if isinstance(obj, Region):
        return obj
    if _is_torch_tensor(obj):
        return _from_torch(obj)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cuda_array_interface(obj, device)
    try:
        return _from_buffer(obj)
    except TypeError:
        raise TypeError(f"{type(obj).__name__} is no memory pdkv can register: give a Region, "
                        "a torch tensor, a __cuda_array_interface__ object or a writable "
                        "buffer") from None
