"""PyTorch's CUDA random numbers, reproduced on the CPU, to rebuild NeMo RL's GPU-only test inputs.

NeMo RL's distillation tests draw their inputs with `torch.manual_seed(42)` on a CUDA device and
assert loss values to 1e-5, so their inputs must be the GPU's numbers. PyTorch's CUDA generator is
Philox4x32-10 (Salmon et al., SC'11): a kernel thread `idx` of a launch with `grid` blocks of 256
threads takes counter `(offset / 4 + call, idx)`; element `li` is component `ii` of its thread's draw,
with `li = call * stride + ii * threads + idx`, `threads = 256 * grid`, `stride = 4 * threads`. Each
launch advances the offset by 4 per call. `randint(0, n)` keeps `x % n`; `randn` uses Box-Muller on
`(x, y)` and `(z, w)`: `sqrt(-2 log u) * (sin v, cos v)`. The GPU's float32 log / sincos differ from
these float64 ones by about 1e-7, far inside NeMo RL's tolerances.

The grid depends on the GPU only above `256 * 8 * sm_count` elements (270,336 on an H100); below
that the numbers are the same on every GPU. `test_distillation.py` checks this module against CUDA
when a GPU is present, and against NeMo RL's expected losses (which need these exact inputs) always.
"""

from __future__ import annotations

import math

import numpy as np
import torch

_M0, _M1, _W0, _W1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57), 0x9E3779B9, 0xBB67AE85
_LOW = np.uint64(0xFFFFFFFF)
_2POW32_INV = 2.3283064365386963e-10


def _philox(c0, c1, c2, c3, seed: int):
    """Philox4x32-10 of counters `(c0, c1, c2, c3)` (uint64 arrays holding 32-bit values)."""
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    for _ in range(10):
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & _LOW, (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & _LOW
        k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
    return c0, c1, c2, c3


class CudaGenerator:
    """The default CUDA generator after `torch.manual_seed(seed)`: `randint` and float32 `randn`."""

    def __init__(self, seed: int, sm_count: int = 132):
        self.seed, self.offset, self.sm_count = seed, 0, sm_count

    def _draws(self, numel: int):
        """Each element's 32-bit draw components: `(x, y, z, w)` of its thread's draw, and its `ii`."""
        if numel == 0:  # no kernel launch: the offset does not move
            empty = np.zeros(0, dtype=np.uint64)
            return (empty,) * 4, empty
        threads = 256 * min((numel + 255) // 256, self.sm_count * 8)
        stride = 4 * threads
        calls = (numel - 1) // stride + 1
        # One Philox evaluation per (call, thread), then spread over the elements that use it.
        thread = np.arange(calls * threads, dtype=np.uint64)
        counter = np.uint64(self.offset // 4) + thread // np.uint64(threads)
        idx = thread % np.uint64(threads)
        self.offset += 4 * calls
        draws = _philox(counter & _LOW, counter >> np.uint64(32), idx & _LOW, idx >> np.uint64(32), self.seed)
        li = np.arange(numel, dtype=np.int64)
        call, within = li // stride, li % stride
        ii, source = within // threads, call * threads + within % threads
        return tuple(d[source] for d in draws), ii.astype(np.uint64)

    def randint(self, high: int, shape) -> torch.Tensor:
        """`torch.randint(0, high, shape, device="cuda")` (int64)."""
        draws, ii = self._draws(math.prod(shape))
        chosen = np.choose(ii.astype(np.int64), draws)
        return torch.from_numpy((chosen % np.uint64(high)).astype(np.int64)).reshape(shape)

    def randn(self, shape) -> torch.Tensor:
        """`torch.randn(shape, device="cuda")` (float32)."""
        (x, y, z, w), ii = self._draws(math.prod(shape))
        first_pair = ii < 2
        a, b = np.where(first_pair, x, z), np.where(first_pair, y, w)
        u = a.astype(np.float32) * np.float32(_2POW32_INV) + np.float32(_2POW32_INV / 2)
        v = b.astype(np.float32) * np.float32(_2POW32_INV * 2 * math.pi) + np.float32(_2POW32_INV * math.pi)
        radius = np.sqrt(-2.0 * np.log(u.astype(np.float64)))
        angle = v.astype(np.float64)
        out = np.where(ii % np.uint64(2) == 0, np.sin(angle), np.cos(angle)) * radius
        return torch.from_numpy(out.astype(np.float32)).reshape(shape)
