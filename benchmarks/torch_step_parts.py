"""Where a training step's time goes under tnt on Keras' torch backend, per rank.

Trains one of benchmarks/training.py's models (the same builders and synthetic data) on this rank's
slice of every global batch, and reports per step: the wall time, this process's CPU time, and the
time spent in tnt's parts, by timing three functions of ``tnt_keras.backends.torch.gradients``:

- ``hooks``: the post-accumulate-grad hooks (scaling each gradient into its bucket, starting full
  buckets), run inside backward;
- ``sum``: the optimizer's ``apply`` waiting for the buckets' sums (the last bucket starts when
  backward ends on every rank, so this holds the wait for the slower rank);
- ``share``: the wait for the step's row count (an allreduce started at the top of the step).

With ``--solo`` the same process trains the plain Keras model on its slice with no communication at
all (the ceiling of benchmarks/training.py, one process per rank), for comparison in the same run.
Thread variables as tnt-launch sets them (one intra-op thread per rank on 2 cores, 2 ranks).

    tnt-launch -n 2 --output-on-all-devices -- benchmarks/torch_step_parts.py [--model lenet] [--solo]

Each rank prints one line: the median over ``--rounds`` epochs of ``--steps`` steps, after one
epoch of warm-up.

``--overhead`` (one rank) measures what tnt's wrapper costs with no communication, as
``wrapper_overhead.py --backend torch`` does (it runs that script's ABBA rounds).

    tnt-launch -n 1 -- benchmarks/torch_step_parts.py --overhead [--model lenet]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["KERAS_BACKEND"] = "torch"

import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("MKL_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or 1))

import keras  # noqa: E402
import tnt_keras as tnt  # noqa: E402
from tnt_keras.backends.torch import gradients  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _training_worker as worker  # noqa: E402
import wrapper_overhead  # noqa: E402

SPENT = {"share": 0.0, "sum": 0.0, "hooks": 0.0}


def timed(part: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def measured(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            SPENT[part] += time.perf_counter() - start

    return measured


gradients.StepState.fraction = timed("share", gradients.StepState.fraction)
gradients.Plan.sum = timed("sum", gradients.Plan.sum)
gradients.Plan.on_gradient = timed("hooks", gradients.Plan.on_gradient)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(worker.MODELS), default="lenet")
    parser.add_argument("--batch", type=int, help="global batch (default: the benchmark's for the model)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--solo", action="store_true", help="plain Keras on this rank's slice, no communication")
    parser.add_argument("--overhead", action="store_true", help="tnt.Model against plain Keras in one process")
    args = parser.parse_args()
    if args.overhead:
        print(wrapper_overhead.measure(keras, tnt, worker, args), flush=True)
        return
    data = argparse.Namespace(
        batch=args.batch or wrapper_overhead.BATCHES[args.model], steps=args.steps, samples=4096, seed=1,
        model=args.model,
    )
    rank, size = tnt.get_rank(), tnt.get_size()
    spec = worker.MODELS[args.model]
    x, y = worker.synthetic(spec, data)
    model = compiled(spec, wrap=not args.solo)
    # tnt slices the global batches itself; solo takes this rank's rows of each, as the ceiling does.
    batches = worker.cached_batches(keras, x, y, data, rank if args.solo else 0, size if args.solo else 1)
    model.fit(batches, epochs=1, steps_per_epoch=args.steps, shuffle=False, verbose=0)  # warm-up
    rounds = []
    for _ in range(args.rounds):
        SPENT.update(dict.fromkeys(SPENT, 0.0))
        wall, cpu = time.perf_counter(), time.process_time()
        model.fit(batches, epochs=1, steps_per_epoch=args.steps, shuffle=False, verbose=0)
        per_step = 1000 / args.steps
        rounds.append(
            [
                (time.perf_counter() - wall) * per_step,
                (time.process_time() - cpu) * per_step,
                *(SPENT[p] * per_step for p in ("hooks", "sum", "share")),
            ]
        )
    step, cpu, hooks, waited, share = (statistics.median(column) for column in zip(*rounds, strict=True))
    what = "solo (no communication)" if args.solo else "tnt"
    print(
        f"rank {rank}/{size} {what}, {args.model} B={data.batch}: step {step:.1f} ms, CPU {cpu:.1f} ms, "
        f"hooks {hooks:.2f} ms, sum wait {waited:.2f} ms, share wait {share:.2f} ms",
        flush=True,
    )


def compiled(spec: Any, wrap: bool) -> keras.Model:
    keras.utils.set_random_seed(1)
    model = spec.build(keras)
    if wrap:
        model = tnt.Model(model)
    model.compile(**worker.training_setup(keras))
    return model


if __name__ == "__main__":
    main()
