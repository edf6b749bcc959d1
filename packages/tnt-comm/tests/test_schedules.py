"""Random legal programs of collectives on overlapping groups complete, with numpy's results.

Hypothesis draws the programs. Every rank runs the same seeded @given tests, so every rank draws
the same programs without exchanging them, and runs the calls of the groups it belongs to.
A program is legal when the calls of each group start in the same order on all its members (the
MPI rule, docs/comm.md); how blocking and non-blocking calls of different groups interleave, and
in which order a rank waits for its non-blocking calls, is free. A rank that deadlocked would
raise Timeout after TNT_TIMEOUT_S and fail the test: nothing here waits on a timeout to pass.
"""

from __future__ import annotations

import pytest
from ranks import GPI2, run

PROGRAMS = r"""
import itertools, os, random, sys, numpy as np, tnt_comm as tc
from hypothesis import HealthCheck, Phase, given, seed, settings, strategies as st

r, n = tc.rank(), tc.size()
WANT = int(os.environ["TNT_TEST_CALLS"])
# Groups of 3 and 4 ranks that overlap, several of the same ranks in other orders.
GROUPS = [list(range(n)), [3, 2, 1, 0], [0, 1, 2], [2, 0, 3], [1, 3, 2], [3, 1, 0, 2]]
groups = [tc.world() if i == 0 else tc.new_group(g) if r in g else None for i, g in enumerate(GROUPS)]
KINDS = ["allreduce", "allreduce_in_place", "allreduce_shared", "broadcast", "allgather", "allgatherv",
         "reduce_scatter", "sendrecv", "fused"]
DTYPES = [np.float64, np.float32, np.int32]
calls = 0  # calls started on any group: the same count on every rank


def data(call, q, count, dtype):
    # Small integers: every sum is exact in every dtype, whatever order an algorithm adds in.
    return ((np.arange(count) + 3 * call + 5 * q) % 7).astype(dtype)


def check(got, want, what):
    if got.shape != want.shape or not np.array_equal(got, want):
        # Said at once: hypothesis re-runs a failing program, on this rank alone.
        print(f"rank {r}: wrong result in {what}: {got[:8]} against {want[:8]}", file=sys.stderr, flush=True)
        raise AssertionError(what)


# One call, drawn as a size class (1 in 40 several 256 KiB chunks, which fill message windows;
# 10 in 40 medium) and one number that holds the rest (each value drawn costs hypothesis about as
# much as a small collective here, so a call's other choices share one): what, on which group, how
# many elements, dtype, blocking or not, who sends, the fused tensors' start order, whether to wait
# for a call in flight afterwards, and which.
SIZES = ["small"] * 29 + ["medium"] * 10 + ["large"]
CALL = st.tuples(st.integers(0, (1 << 63) - 1), st.sampled_from(SIZES))
# A program: 1-24 calls, then the seed of the order in which the calls still in flight at its end
# are waited for.
PROGRAM = st.tuples(st.lists(CALL, min_size=1, max_size=24), st.integers(0, 1 << 32))
ORDERS = list(itertools.permutations(range(3)))


def plan(c, call):
    # (group index, blocking, launch, wait): launch() makes the call on a member and returns
    # (result, checks): a Work (or "fused") to wait for before the checks, or a blocking call's
    # result; None for ranks outside the group. wait: None, or which call in flight to wait for.
    mixed, size = c
    # Hypothesis favours small numbers, which would leave the higher choices below at their
    # first value most of the time: a bijective scramble spreads them evenly.
    mixed = (mixed * 0x9E3779B97F4A7C15) % (1 << 64)
    mixed ^= mixed >> 29
    mixed, kind = divmod(mixed, len(KINDS))
    mixed, gi = divmod(mixed, len(GROUPS))
    mixed, value = divmod(mixed, 5_000)
    kind = KINDS[kind]
    count = {"large": (40_000, 100_001, 300_001)[value % 3], "medium": 65 + value % 4_936, "small": value % 65}[size]
    mixed, di = divmod(mixed, len(DTYPES))
    mixed, blocking = divmod(mixed, 4)  # 1 in 4 blocking
    mixed, root_i = divmod(mixed, 4)
    mixed, other_i = divmod(mixed, 3)
    mixed, order_i = divmod(mixed, len(ORDERS))
    which, wait_now = divmod(mixed, 4)
    members = GROUPS[gi]
    root = members[root_i % len(members)]
    other = [m for m in members if m != root][other_i % (len(members) - 1)]
    blocking = blocking == 0 or kind == "allgatherv"  # which has no non-blocking form
    wait = which if wait_now == 0 else None
    g = groups[gi]
    if g is None:
        return gi, blocking, None, wait
    go = lambda: launch(g, kind, members, count, DTYPES[di], blocking, root, other, ORDERS[order_i], call)  # noqa: E731
    return gi, blocking, go, wait


def launch(g, kind, members, count, dtype, blocking, root, other, order, call):
    me = g.rank
    xs = {q: data(call, q, count, dtype) for q in members}
    total = sum(xs[q].astype(np.int64) for q in members).astype(dtype) if count else np.zeros(0, dtype)
    what = (call, kind, GROUPS.index(members), count, np.dtype(dtype).name, blocking)
    if kind in ("allreduce", "allreduce_in_place"):
        x = xs[r].copy()
        out = x if kind == "allreduce_in_place" else None
        result = g.allreduce(x, out=out) if blocking else g.iallreduce(x, out=out)
        return result, lambda y: check(y, total, what)
    if kind == "allreduce_shared":  # buffers in the shared arena: the single-copy path from 256 KiB on one host
        x = tc.shared_empty(count, dtype)
        x[:] = xs[r]
        out = x if count % 2 else tc.shared_empty(count, dtype)
        result = g.allreduce(x, out=out) if blocking else g.iallreduce(x, out=out)
        return result, lambda y: check(y, total, what)
    if kind == "broadcast":
        x = xs[r].copy()
        result = g.broadcast(x, root=members.index(root)) if blocking else g.ibroadcast(x, root=members.index(root))
        return result, lambda y: check(x, xs[root], what)
    if kind == "allgather":
        result = g.allgather(xs[r]) if blocking else g.iallgather(xs[r])
        return result, lambda y: check(y, np.stack([xs[q] for q in members]), what)
    if kind == "allgatherv":  # a different length on every member
        mine = data(call, r, count + 3 * me, dtype)
        y = g.allgatherv(mine)
        want = np.concatenate([data(call, q, count + 3 * i, dtype) for i, q in enumerate(members)])
        return y, lambda y: check(y, want, what)
    if kind == "reduce_scatter":
        k = len(members)
        blocks = {q: data(call, q, k * (count // k + 1), dtype) for q in members}
        full = sum(blocks[q].astype(np.int64) for q in members).astype(dtype)
        per = count // k + 1
        result = g.reduce_scatter(blocks[r]) if blocking else g.ireduce_scatter(blocks[r])
        return result, lambda y: check(y, full[me * per:(me + 1) * per], what)
    if kind == "sendrecv":
        if r == root:
            result = g.send(xs[r], members.index(other)) if blocking else g.isend(xs[r], members.index(other))
            return result, lambda y: None
        if r == other:
            buf = np.empty(count, dtype)
            result = g.recv(buf, members.index(root)) if blocking else g.irecv(buf, members.index(root))
            return result, lambda y: check(buf, xs[root], what)
        return None, lambda y: None  # a member that neither sends nor receives
    # fused: three tensors in two buckets, started in an order of their own
    shapes = [(count,), (5,), (max(count // 2, 1), 2)]
    fused = tc.FusedAllreduce([(s, dtype) for s in shapes], threshold_bytes=8 * max(count, 1), group=g)
    tensors = [data(call + i, r, int(np.prod(s)), dtype).reshape(s) for i, s in enumerate(shapes)]
    for i in order:
        fused.start(i, tensors[i])

    def check_fused(_):
        for i, s in enumerate(shapes):
            want = sum(data(call + i, q, int(np.prod(s)), dtype).astype(np.int64) for q in members).astype(dtype)
            check(fused.wait(i), want.reshape(s), what + (i,))
    return None if blocking else "fused", check_fused


def one_program(program):
    global calls
    chosen, last_waits = program
    pending = []  # started: (result, checks)
    batch = []    # drawn non-blocking calls not started yet: (group index, launch)

    def start_batch():
        # This rank's own interleaving of the drawn non-blocking calls: each group's calls keep
        # their order (the rule), the groups take turns as this rank's generator says. Every rank
        # thus starts the calls of different groups in an order of its own.
        queues = {}
        for gi, go in batch:
            queues.setdefault(gi, []).append(go)
        mix = random.Random(1000 * calls + r)
        while queues:
            gi = mix.choice(sorted(queues))
            pending.append(queues[gi].pop(0)())
            if not queues[gi]:
                del queues[gi]
        batch.clear()

    def finish(result, checks):
        checks(result if isinstance(result, str) else result.wait() if isinstance(result, tc.Work) else result)

    for c in chosen:
        gi, blocking, go, wait = plan(c, calls)
        calls += 1
        if go is not None and not blocking:
            batch.append((gi, go))
        elif go is not None:
            start_batch()
            finish(*go())
        # Now and then wait for one of the calls in flight, any of them.
        if wait is not None:
            start_batch()
            if pending:
                finish(*pending.pop(wait % len(pending)))
    start_batch()
    order = random.Random(last_waits)
    while pending:
        finish(*pending.pop(order.randrange(len(pending))))


# Batches of 20 programs, each batch from a seed of its own: the same programs on every rank.
# Only generation: shrinking a failure would re-run calls on one rank alone.
seed_no = 0
while calls < WANT:
    seed(seed_no)(settings(max_examples=20, database=None, deadline=None, phases=[Phase.generate],
                         suppress_health_check=list(HealthCheck))(given(PROGRAM)(one_program)))()
    seed_no += 1
assert calls >= WANT, calls
tc.barrier()
print(f"calls {calls} transports {sorted(set(t for t in tc.transports() if t != 'self'))}")
"""

# Over GPI-2 (TNT_TEST_TRANSPORT=gpi2, nox's comm_static session) every pair runs over it.
TRANSPORTS = ["gpi2"] if GPI2 else ["shm", "tcp"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_random_programs_on_overlapping_groups(transport: str, tmp_path) -> None:
    """10,000 calls of every kind on six overlapping groups of 3-4 ranks, blocking and not, waited
    for in drawn orders: every rank completes every call with numpy's result."""
    env = {"TNT_TEST_CALLS": "10000", "TNT_TIMEOUT_S": "60"}
    if transport == "tcp":
        env["TNT_TRANSPORT"] = "tcp"
    results = run(4, PROGRAMS, tmp_path, timeout=280, env=env)
    for res in results:
        assert "calls " in res.stdout, res.stdout[-2000:]
        assert transport in res.stdout.split("transports")[-1], res.stdout[-500:]
