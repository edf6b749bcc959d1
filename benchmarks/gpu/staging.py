"""What one gradient bucket of CUDA tensors costs on the torch backend: the staged allreduce (pack on
the device, one copy to pinned host memory, tnt-comm's allreduce, one copy back), against its parts
measured alone in the same run: the two copies, and the host allreduce of the same bytes.

Run by ``benchmarks/gpu/run.sh`` on 2 ranks sharing one GPU:
``KERAS_BACKEND=torch tnt-launch -n 2 --ranks-per-gpu 2 -- python benchmarks/gpu/staging.py OUT_DIR``.
Medians of 20 timed rounds after 3 warm-ups; rank 0 prints the table and writes OUT_DIR/staging.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np
import tnt_comm
import tnt_keras as tnt
import torch
from tnt_keras.backends.torch.gradients import _CudaBuckets

SIZES_MIB = [0.25, 1, 4, 16, 64]
WARMUP, ROUNDS = 3, 20


def timed(run: object) -> float:
    for _ in range(WARMUP):
        run()
    samples = []
    for _ in range(ROUNDS):
        tnt_comm.barrier()
        torch.cuda.synchronize()
        begin = time.perf_counter()
        run()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - begin)
    return statistics.median(samples)


def measure(mib: float, device: torch.device) -> dict:
    """One bucket of ``mib`` MiB of float32: its staged sum, checked, and the times of it and its parts."""
    count = int(mib * 2**20) // 4
    grad = torch.randn(count, device=device)
    buckets = _CudaBuckets([(count,)], [torch.float32], 0, device)  # host side in the shared arena
    pinned = _CudaBuckets([(count,)], [torch.float32], 0, device, shared=False)  # pinned by torch
    host = torch.empty(count, pin_memory=True)
    host_np = host.numpy()
    back = torch.empty(count, device=device)

    def staged(buckets: _CudaBuckets = buckets) -> None:
        buckets.start(0, grad, 1.0)
        buckets.finish(0)
        buckets.reset()

    def copies() -> None:
        host.copy_(grad, non_blocking=True)
        back.copy_(host, non_blocking=True)

    def host_allreduce() -> None:
        tnt_comm.allreduce(host_np, out=host_np)

    def arena_allreduce() -> None:
        tnt_comm.allreduce(buckets.host_np[0], out=buckets.host_np[0])

    # The staged sum is right: every rank's tensor summed, back on the GPU.
    expected = tnt_comm.allreduce(grad.cpu().numpy())
    for variant in (buckets, pinned):
        variant.start(0, grad, 1.0)
        got = variant.finish(0).cpu().numpy()
        variant.reset()
        assert np.array_equal(got, expected), "the staged allreduce gave a wrong sum"
    t_staged, t_copies, t_host = timed(staged), timed(copies), timed(host_allreduce)
    t_pinned = timed(lambda: staged(pinned))
    t_arena = timed(arena_allreduce)
    return {
        "MiB": mib,
        "staged_ms": t_staged * 1e3,
        "staged_torch_pinned_ms": t_pinned * 1e3,
        "copies_ms": t_copies * 1e3,
        "host_allreduce_ms": t_host * 1e3,
        "arena_allreduce_ms": t_arena * 1e3,
        "arena_registered": hasattr(buckets.host[0], "_tnt_registered"),
        "staged_GBps": count * 4 / t_staged / 1e9,
        "overhead_vs_parts": t_staged / (t_copies + t_arena),
    }


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    device = torch.device("cuda")
    rows = [measure(mib, device) for mib in SIZES_MIB]
    if tnt.get_rank() == 0:
        print(f"{tnt.get_size()} ranks on {torch.cuda.get_device_name()}, medians of {ROUNDS}")
        print("staged: the bucket's host side in the shared arena (tnt's choice); pinned: pinned by torch instead")
        print("AR: tnt-comm's host allreduce alone, of an arena array / of torch's pinned memory; vs parts: staged")
        print(f"over (copies + AR arena); arena registered with CUDA: {rows[0]['arena_registered']}")
        header = f"{'MiB':>6} {'staged ms':>10} {'pinned ms':>10} {'copies ms':>10} {'AR arena':>9} {'AR pinned':>10}"
        print(header + f" {'GB/s':>7} {'vs parts':>9}")
        for r in rows:
            print(
                f"{r['MiB']:>6} {r['staged_ms']:>10.3f} {r['staged_torch_pinned_ms']:>10.3f} {r['copies_ms']:>10.3f} "
                f"{r['arena_allreduce_ms']:>9.3f} {r['host_allreduce_ms']:>10.3f} {r['staged_GBps']:>7.2f} "
                f"{r['overhead_vs_parts']:>9.2f}"
            )
        with open(os.path.join(out, "staging.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "ranks": tnt.get_size(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
