"""Elastic fits (tnt-launch --elastic): ranks are killed (SIGKILL) inside a real job, before a training
step, inside one between its gradient sum and its metric sum, at random points of steps, at an
epoch's end, during the validation of an epoch, during a later evaluate and predict and in the
closing collectives between those calls, rank 0 and two ranks at once among them, in a second fit of
the model too, and on a PyDataset, a DataLoader and tf.data pipelines (one reshuffling every epoch)
as well as arrays; the survivors re-form the job, redo the step (on JAX too) or take it from a
survivor that finished it (on JAX, whose step sums the test scripts), finish an epoch's end (taking
a collective's result from the survivor that had it), redo the epoch or the call, or return from a
call every rank had finished, and end with what serial Keras ends with on the same global batches:
weights and optimizer state, every epoch's logs in History, and the evaluate's results; where rank 0
writes a CSV log, the best epoch's model and a backup, the files serial Keras writes, also where
rank 0 is lost or a replacement joins. Fewer ranks left than --elastic asks for end the job as a
lost rank does without it."""

import os
import random

import pytest
from conftest import skip_unless_installed
from launch import _launch
from test_training import TOL

pytestmark = pytest.mark.by_backend

# (elastic_job.py's arguments, the ranks whose reports stand: their TNT_RANK, which a replacement
# takes from the rank it replaces, and --elastic): torch runs all of them but the second fit on arrays
# (its PyDataset's is a second fit; its tf.data pipeline comes whole as a TensorFlow one does);
# TensorFlow a rank lost after the gradient sum, rank 0's loss, a replacement joining mid-epoch, the
# calls' boundaries and a second fit; JAX (whose jobs cost the most: compiling) a lost step redone and a
# replacement joining mid-epoch, and the calls' boundaries (and one of the random kills' jobs).
SCENARIOS = {
    # Lost before a training step; then another in the predict after the fit (generation 1).
    "step": (["1@1:batch:2", "3@0:predict:1:1"], [0, 2], "2"),
    # Killed after the step's gradient sum: the survivors' updates must not have been applied yet, the
    # moving statistics of the model's SyncBatchNormalization, which the step's forward pass has changed,
    # must be put back (without that, the weights end 6e-3 away from serial Keras'), and the batch dealt
    # again must carry the fit's class weights (without them, 3e-2 away). Then, in generation 1, lost in a
    # collective at that epoch's end that one survivor finished and one did not: it takes the result from
    # that one, which has gone on to the next collective (or into the next step), and the two go on from
    # there: no epoch trained twice, every end heard once.
    "after-gradient-sum": (["model=syncbn", "class_weight", "2@1:metrics:1", "1@1:end_exchange:1:1"], [0, 3], "2"),
    # Stopped (SIGSTOP) before a step: the others time out, go on without it, and tnt-launch ends it.
    "stopped": (["1@1:stop:1"], [0, 2, 3], "2"),
    # Rank 0 lost at an epoch's end, in the ModelCheckpoint's save of the best model before it writes, with the
    # others in that callback's outcome: they put it back as it was, run it again on the ranks left (the new
    # rank 0 writes), and finish the end of epoch 2 there (on TensorFlow, a tf.data pipeline's epoch end);
    # then another in the evaluate after the fit (generation 1). The new rank 0 goes on with the files of
    # the CSVLogger, the ModelCheckpoint and the BackupAndRestore in the same fit (on the code before, with
    # rank 0 lost after that epoch's callbacks, the job hung until the test's timeout: the new rank 0's
    # CSVLogger had never begun), and prints the progress bar from there on.
    "rank-0-epoch-end": (["0@2:checkpoint", "1@0:evaluate:1:1", "files"], [2, 3], "2"),
    # Rank 0 and rank 3 lost at once, in validation: the epoch is begun again in a fit that goes on, where
    # the new rank 0 takes the files over (its ModelCheckpoint knows the best validation loss so far).
    "two-in-validation": (["0@1:validation:1", "3@1:validation:1", "files"], [1, 2], "2"),
    # Rank 2 is lost in epoch 0; tnt-launch starts rank 4 in its place, which joins at epoch 2.
    # With the files and callbacks of "files": the replacement's take their state from rank 0 (without
    # that, its ReduceLROnPlateau halved the learning rate later than the others', and its BackupAndRestore
    # put the weights back to the backup's over those rank 0 handed it).
    "replacement": (["2@0:batch:2", "wait@2", "files"], [0, 1, 2, 3], "2:4"),
    # The same, joining in the middle of epoch 1: replacements are admitted every 6 steps.
    "replacement-mid-epoch": (["2@0:batch:2", "wait@1:2"], [0, 1, 2, 3], "2:4"),
    # Five ranks. Member 1 is lost in a predict that a callback makes at the end of epoch 1, inside the fit:
    # no survivor has finished it, and it is made again on the 4 ranks left in that epoch's end (on JAX,
    # which redoes epochs unless told otherwise, the epoch is redone); member 4 in the fit's closing
    # collective, which member 0 has passed (it is in the evaluate: it begins that again) and members 2 and
    # 3 have not (they return from the fit); member 0 in the evaluate's closing collective, with members 2
    # and 3 both in it (each returns from the evaluate).
    "between-calls": (["1@1:nested:1", "4@0:fit_end:1", "0@0:evaluate_end:0"], [2, 3], "2"),
    # A second fit of the model, whose lost step the first fit's step redo must not take for its own.
    "second-fit": (["first_fit=2", "1@2:metrics:1"], [0, 2, 3], "2"),
    # Rank 1, answering the last sum of a step (its metric states) for rank 0 alone,
    # is lost before it answers ranks 2 and 3. Rank 0 has finished the step and fails in the next one;
    # the others take the finished step's state from it (weights, optimizer and metric states, the
    # SyncBatchNormalization's moving statistics), and rank 0's next step runs again on the 3 ranks left.
    # On JAX (with TNT_ELASTIC_REDO=step) of a model with a SyncBatchNormalization, whose steps sum through
    # Python callbacks the test can script; on torch of the dense model.
    "healed": (["1@1:healed:2"], [0, 2, 3], "2"),
    # Epochs of steps_per_epoch=2 over the 4 batches, which read on through the data from epoch to epoch (on
    # TensorFlow, of a tf.data pipeline that repeats for ever): rank 2 is lost in epoch 1's validation, and the
    # epoch trained again reads batches 2 and 3, as it did (on the code before, it read batches 0 and 1: 0.04
    # away from serial Keras on torch, 0.02 on TensorFlow, silently); then rank 1 in a step of epoch 2
    # (generation 1), which is redone on the 2 ranks left.
    "short-epochs": (["steps_per_epoch=2", "2@1:validation:0", "1@2:batch:1:1"], [0, 3], "2"),
    # Inputs other than arrays: a PyDataset, in a second fit, whose lost step is redone; and a DataLoader
    # that shuffles from its generator. Its worker had read the next two batches for 4 ranks when rank 2
    # is lost in a step (dealt again for 3: without that, 0.016 away from serial Keras in a job of that
    # loss alone; on the code before, which redid the epoch and drew the loader's generator less often
    # than the user's loader, 0.097); rank 2's replacement joins at epoch 2's start in the order rank 0
    # began it with, and rank 3 is lost in epoch 2's validation (generation 2): the epoch is redone in
    # the order it had.
    "pydataset": (["data=pydataset", "first_fit=2", "2@2:batch:1"], [0, 1, 3], "2"),
    "dataloader": (["data=dataloader", "2@1:metrics:1", "wait@2", "3@2:validation:1:2"], [0, 1, 2], "2:4"),
    # Two ranks, one left after a loss in epoch 1's validation: the epoch begun again on the one rank still
    # reads the order it had (on the code before, the loader went to Keras as it was on one rank, its
    # generators not set back: 0.032 away from serial Keras).
    "dataloader-one-left": (["data=dataloader", "1@1:validation:1"], [0], "1"),
    # A tf.data pipeline that shuffles anew every epoch, validated on another (on TensorFlow and torch):
    # the step is redone on the batch the pipeline gave, sliced for 3 ranks, and the iterator goes on in
    # its order.
    # The replacement tnt-launch starts, which the ranks wait for at epoch 2's start, is not admitted
    # there: it would read another order than the others.
    "tfdata-step": (["data=tfdata-shuffled", "3@1:metrics:2", "wait@2"], [0, 1, 2], "2:4"),
    # A PyDataset that puts its batches in a new order at every epoch's end, from a numpy state of its own:
    # the lost step is redone, and the replacement the ranks wait for at epoch 2 is not admitted (it would
    # begin from another order: admitted, as on the code before, the weights ended 0.017 from serial Keras).
    "pydataset-reordered": (["data=pydataset-reordered", "2@1:metrics:1", "wait@2"], [0, 1, 3], "2:4"),
    # A DataLoader whose batch sampler of the user's own shuffles from a numpy state tnt cannot read,
    # read ahead by a worker: rank 2 is lost in epoch 1's validation, and the epoch begun again reads
    # the batches it read (without that, 0.054 away from serial Keras; on the code before, which also
    # admitted the replacement, 0.051); the replacement the ranks wait for at epoch 2 is not admitted
    # (it could not draw the others' order); rank 3 is lost in a step of epoch 2 (generation 1).
    "own-sampler": (["data=own-sampler", "2@1:validation:1", "wait@2", "3@2:metrics:1:1"], [0, 1], "2:4"),
}
# Where a case trains on another input than arrays, beside what its scenario tests; JAX calls a
# metric's update only while it traces the step, so its PyDataset case is one with a kill before a step.
INPUTS = {("tensorflow", "rank-0-epoch-end"): ("data=tfdata",), ("jax", "replacement-mid-epoch"): ("data=pydataset",),
          ("jax", "healed"): ("model=syncbn",), ("tensorflow", "short-epochs"): ("data=tfdata-repeated",)}
EVERY_RANK_SAYS = ("--log-on-all-devices", "--output-on-all-devices")  # which call each survivor goes on with
EXTRA = {"replacement-mid-epoch": ("-x", "TNT_ELASTIC_ADMIT_STEPS=6"), "between-calls": EVERY_RANK_SAYS,
         "healed": EVERY_RANK_SAYS,
         "dataloader": ("--max-restarts", "1")}
RANKS = {"between-calls": 5, "dataloader-one-left": 2}  # the others start 4
# JAX redoes the epoch unless told to redo the step (step_redo.REDO: each step is then waited for).
REDO_STEPS = ("-x", "TNT_ELASTIC_REDO=step")
BACKEND_EXTRA = {("jax", "replacement-mid-epoch"): REDO_STEPS, ("jax", "healed"): REDO_STEPS}
CASES = [("torch", name) for name in SCENARIOS if name != "second-fit"] + [
    ("tensorflow", "after-gradient-sum"),  # the lost step redone, in a traced step
    ("tensorflow", "rank-0-epoch-end"),  # on a tf.data pipeline
    ("tensorflow", "replacement-mid-epoch"),
    ("tensorflow", "between-calls"),  # the calls' boundaries, with the closing collectives after traced steps
    ("tensorflow", "second-fit"),  # the traced train function the first fit wrapped, wrapped once again
    ("tensorflow", "tfdata-step"),
    ("tensorflow", "short-epochs"),  # on a tf.data pipeline that repeats for ever: past the epochs before
    # A lost step redone and a replacement that joins mid-epoch (the steps done passed over, the metric
    # states handed on), on a PyDataset, with TNT_ELASTIC_REDO=step: the costliest backend once.
    ("jax", "replacement-mid-epoch"),
    ("jax", "between-calls"),  # the closing collectives after steps Keras-JAX dispatched asynchronously; epochs redone
    ("jax", "healed"),  # a step one survivor finished and two did not, its state taken from that one
]


def close(got: float, want: float) -> bool:
    """Equal up to TOL relative to the value (8 ulps of float32: the sums differ only in order)."""
    return abs(got - want) <= TOL * max(1.0, abs(want))


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("backend", "scenario"), CASES, ids=[f"{b}-{s}" for b, s in CASES])
def test_an_elastic_fit_that_loses_ranks_equals_serial_training(backend: str, scenario: str) -> None:
    skip_unless_installed(backend)
    args, slots, elastic = SCENARIOS[scenario]
    args = [*args, *INPUTS.get((backend, scenario), ())]
    # A rank that is stopped is found by the timeout; the others wait in a collective for a replacement
    # to reach its fit (a TensorFlow import and a model build on a loaded machine): a longer one.
    timeout = {"stopped": "10", "replacement": "60", "replacement-mid-epoch": "60", "tfdata-step": "60",
               "dataloader": "60", "own-sampler": "60", "pydataset-reordered": "60"}.get(
        scenario, "30")
    result = _launch("elastic_job", RANKS.get(scenario, 4), tuple(args), timeout=280, backend=backend,
                     launcher_args=("--elastic", elastic, "--timeout", timeout, *EXTRA.get(scenario, ()),
                                    *BACKEND_EXTRA.get((backend, scenario), ())))
    assert f"finished on {len(slots)} rank(s)" in result.output, result.output[-4000:]
    reports = [result.ranks[slot] for slot in slots]
    members = sorted(report["member"] for report in reports)
    for report in reports:
        assert report, result.output[-4000:]
        assert report["members"] == members and report["size"] == len(slots) and report["generation"] >= 1
        # A replacement's History begins with the epoch it joined at.
        assert report["epochs"] == report["serial_epochs"][-len(report["epochs"]):] and report["epochs"][-1] == 3
        # Callbacks see each epoch end once, also one at whose end a rank was lost.
        assert report["ends"] == list(range(report["ends"][0], 4)), report["ends"]
        # A collective's result at each epoch's end, made or taken from a survivor that had it. In
        # between-calls on JAX, which redoes epochs, the rank lost in the predict of a later callback sends
        # the job back to epoch 1's start after the callback making it had heard that end (docs/keras.md:
        # list counting ones after); where steps are redone, the predict is made again at that epoch's end.
        heard = [100 + e for e in report["ends"]]
        twice = scenario == "between-calls" and backend == "jax"
        assert report["end_results"] == (heard[:2] + heard[1:] if twice else heard), report
        assert report["variables_error"] <= TOL * max(1.0, report["scale"]), report
        for key, values in report["serial_history"].items():
            got = report["history"][key]
            assert all(map(close, got, values[-len(got):])), (key, got, values)
        for key, value in report["serial_evaluated"].items():
            assert close(report["evaluated"][key], value), (key, report["evaluated"], report["serial_evaluated"])
        assert report["predicted_shape"] == [48, 1], report  # every row once, in order
        if "files" in args:  # each epoch's row once, the best epoch's model, the last epoch's backup
            assert report["csv_epochs"] == [list(range(4))] * 2, report
            assert report["csv_columns"][0] == report["csv_columns"][1] and report["csv_error"] <= TOL, report
            assert report["best_error"] <= TOL * max(1.0, report["scale"]) and report["backup_epochs"] == [4, 4], report
            (wait, best, epoch), (serial_wait, serial_best, serial_epoch) = report["waited"], report["serial_waited"]
            assert (wait, epoch) == (serial_wait, serial_epoch) and close(best, serial_best), report
        assert report["predict_error"] <= TOL * max(1.0, report["predict_scale"]), report
    redone_steps = ("step", "after-gradient-sum", "stopped", "second-fit", "pydataset", "dataloader", "tfdata-step",
                    "pydataset-reordered", "healed")
    if scenario in redone_steps:
        assert "runs again on 3 rank(s)" in result.output, result.output
        assert ("trains epoch" in result.output) == (scenario == "dataloader"), result.output
    # Said at the start where the input reshuffles (an epoch begun again would read another order), only there.
    reorders = scenario in ("tfdata-step", "pydataset-reordered")
    assert ("may change its order each time it is read" in result.output) == reorders, result.output
    if reorders:
        local = 3 if scenario == "tfdata-step" else 2
        assert f"rank 4 (host localhost, local rank {local}) was not needed" in result.output, result.output[-4000:]
    if scenario in ("rank-0-epoch-end", "after-gradient-sum"):  # the epoch's end finished, the epoch not redone
        finished = "epoch 3 is finished on 3" if scenario == "rank-0-epoch-end" else "epoch 2 is finished on 2"
        assert f"the end of {finished} rank(s)" in result.output, result.output[-4000:]
        assert "trains epoch" not in result.output, result.output[-4000:]
    if scenario == "rank-0-epoch-end":  # the new rank 0 prints the progress from where the lost one was
        assert "the progress bar goes on on this rank, the master now" in result.output, result.output[-4000:]
        # Each epoch's line once (epoch 3's from the new rank 0: the lost one died before it printed it).
        lines = [line for line in result.output.splitlines() if line.startswith("4/4 - ")]
        assert len(lines) == 4 and all("val_loss" in line for line in lines), result.output[-4000:]
    if scenario in ("two-in-validation", "dataloader-one-left"):  # the epoch redone, no step
        assert "trains epoch" in result.output and "runs again" not in result.output, result.output
    lost = [int(a.split("@")[0]) for a in args if "@" in a and not a.startswith("wait")]
    for victim in lost:
        how = "is left out of the job" if scenario == "stopped" else "is lost"
        assert f"rank {victim} (host localhost, local rank {victim}) {how}" in result.output, result.output[-4000:]
    if scenario.startswith("replacement"):
        assert members == [0, 1, 3, 4] and "joined: rank 4" in result.output, result.output[-4000:]
        # Rank 2 was lost before a step of epoch 0: the step is redone (on JAX too), no epoch trained again.
        assert "step 3 of this fit runs again on 3 rank(s)" in result.output, result.output[-4000:]
        assert "trains epoch" not in result.output, result.output[-4000:]
        joined = [2, 3] if scenario == "replacement" else [1, 2, 3]
        assert [r["epochs"] for r in reports if r["member"] == 4] == [joined]
    if scenario == "between-calls":
        lines = result.output.splitlines()
        redone = [line for line in lines if "the job trains epoch" in line]
        finished = [line for line in lines if "the end of epoch 2 is finished on 4 rank(s)" in line]
        if backend == "jax":  # the epoch redone (JAX's default), on each of the 4 survivors
            assert len(redone) == 4 and all("trains epoch 2 again" in line for line in redone), redone
        else:  # the callback's predict made again on the 4 ranks left, in that epoch's end
            assert not redone and len(finished) == 4, (redone, finished)
        said = {what: [line for line in lines if what in line] for what in (
            "returns from the call every rank had finished", "begins its call again: the other ranks had not begun it")}
        returned, began = said.values()
        assert len(returned) == 4 and len(began) == 1, said  # members 2 and 3, twice each; member 0 once
        assert "members 0, 2, 3)" in began[0] and sum("members 0, 2, 3)" in line for line in returned) == 2, said
        assert sum("members 2, 3)" in line for line in returned) == 2, said
        redid = [line for line in lines if any(f" {again}" in line for again in ("runs again", "evaluates again",
                                                                                   "predicts again"))]
        assert not redid, redid
    if scenario == "dataloader":  # rank 4 joined at epoch 2 (the third), which is then redone on 3 ranks
        assert "the job trains epoch 3 again" in result.output and "joined: rank 4" in result.output, result.output
        assert members == [0, 1, 4] and [r["epochs"] for r in reports if r["member"] == 4] == [[2, 3]], reports
    if scenario == "short-epochs":  # the epoch trained again, then a step redone; no warning of other batches
        assert "the job trains epoch 2 again" in result.output and "runs again on 2 rank(s)" in result.output
        assert "reads on through" not in result.output, result.output[-4000:]
    if scenario == "healed":  # 4 steps an epoch: step 7 is epoch 1's third (1-based)
        lines = result.output.splitlines()
        taken = [line for line in lines if "step 7 of this fit was finished by a survivor; taken from it" in line]
        again = [line for line in lines if "step 8 of this fit runs again on 3 rank(s)" in line]
        assert len(taken) == 2 and len(again) == 1, (taken, again, result.output[-4000:])
    if scenario == "replacement-mid-epoch":
        assert "from epoch 2, step 3 on" in result.output, result.output[-4000:]
    if scenario == "own-sampler":
        assert "the job trains epoch 2 again" in result.output and "runs again on 2 rank(s)" in result.output
        assert "(OwnShuffle), whose state tnt cannot read" in result.output, result.output[-4000:]
        assert "rank 4 (host localhost, local rank 2) was not needed" in result.output, result.output[-4000:]


@pytest.mark.timeout(300)
def test_fewer_ranks_left_than_elastic_asks_for_ends_the_job() -> None:
    result = _launch("elastic_job", 4, ("1@1:batch:1", "2@1:batch:1"), timeout=280, backend="torch",
                     launcher_args=("--elastic", "3", "--timeout", "30"), check=False)
    assert result.returncode != 0, result.output[-4000:]
    assert "failed" in result.output and "killed by signal 9" in result.output, result.output[-4000:]
    assert not any(result.ranks), "no rank may finish the fit"


# Three jobs of three kills each (random ranks, steps and points within the step; the fit split in two
# at a random epoch in some), on torch, TensorFlow (on arrays or a tf.data pipeline) and JAX (with
# TNT_ELASTIC_REDO=step; its steps run compiled, each a pure function of its state that a kill may
# interrupt anywhere); set
# TNT_ELASTIC_SEEDS=a,b,... to run others (a failure names its seed).
SEEDS = [int(s) for s in os.environ.get("TNT_ELASTIC_SEEDS", "").split(",") if s] or [
    random.SystemRandom().randrange(1 << 30) for _ in range(3)
]
RANDOM_BACKENDS = ["torch", "tensorflow", "jax"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("trial", range(len(SEEDS)))
def test_kills_at_random_points_of_an_elastic_fit_leave_it_equal_to_serial_training(trial: int) -> None:
    seed, backend = SEEDS[trial], RANDOM_BACKENDS[trial % len(RANDOM_BACKENDS)]
    skip_unless_installed(backend)
    rng = random.Random(seed)
    victims = rng.sample(range(4), 3)
    # Of the 24 steps of 6 epochs, the last too: a kill timed from it may land in the last validation, the
    # fit's closing collective, or the evaluate and predict after it.
    steps = rng.sample(range(2, 25), 3)
    args = [f"{v}@step:{k}:{rng.uniform(0.0, 1.5):.3f}" for v, k in zip(victims, steps, strict=True)]
    first_fit = rng.choice([0, 0, 2, 3, 4])  # the six epochs in one fit, or in two split there
    args += [f"first_fit={first_fit}"] if first_fit else []
    if backend == "tensorflow" and rng.random() < 0.5:  # its global batches from a tf.data pipeline, whole
        args.append("data=tfdata")
    if backend == "torch" and rng.random() < 0.5:  # from a DataLoader over an IterableDataset (no indices)
        args.append("data=stream")
    redo = REDO_STEPS if backend == "jax" else ()  # (the step redone on every backend)
    result = _launch("elastic_job", 4, ("epochs=6", *args), timeout=280, backend=backend,
                     launcher_args=("--elastic", "1", "--timeout", "30", *redo), check=False)
    context = f"seed {seed} on {backend}: kills {args}\n{result.output[-6000:]}"
    assert result.returncode == 0, context  # the seed and kills first: a failed job's output is long
    assert "finished on 1 rank(s)" in result.output, context
    (survivor,) = [r for r in result.ranks if r]
    assert survivor["serial_epochs"] == list(range(6)) and survivor["epochs"] == list(range(first_fit, 6)), context
    assert survivor["ends"] == list(range(6)), (survivor["ends"], context)
    assert survivor["variables_error"] <= TOL * max(1.0, survivor["scale"]), context
    for key, values in survivor["serial_history"].items():  # the last fit's History: its epochs
        got = survivor["history"][key]
        assert len(got) == 6 - first_fit and all(map(close, got, values[first_fit:])), (key, got, values, context)
    for key, value in survivor["serial_evaluated"].items():
        assert close(survivor["evaluated"][key], value), (key, context)
    assert survivor["predict_error"] <= TOL * max(1.0, survivor["predict_scale"]), context
