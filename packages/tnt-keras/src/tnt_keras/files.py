"""Writing a model's files on the ranks that write: atomically, under the names Keras 3 accepts, and
refusing to overwrite alike on every rank."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable

import numpy as np
import tnt_comm

from . import outcome, runtime


def exists_error(path: str) -> FileExistsError:
    return FileExistsError(f"tnt: {path} exists and overwrite=False; pass overwrite=True to replace it")


def refuse_existing(path: str, overwrite: bool, tnt_save_all_devices: bool) -> None:
    """With ``overwrite=False``, raises the same ``FileExistsError`` on every rank if ``path`` exists.

    The master rank looks and tells the others, since a rank that looked itself might already see
    the file the master is writing. When every rank writes its own file, each looks at its own as
    it writes (``write_atomically``), and a refusal reaches every rank as any failed write does.
    """
    if overwrite or tnt_save_all_devices:
        return
    exists = os.path.exists(path)
    if not outcome.is_alone():
        flag = np.array([int(exists)], dtype=np.int32)
        exists = bool(tnt_comm.broadcast(flag, root=runtime.get_master_rank())[0])
    if exists:
        raise exists_error(path)


def shard_names(index: str) -> set[str]:
    """The shard files that the Keras ``.weights.json`` index at ``index`` names (none if unreadable)."""
    try:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        names = [n for v in weight_map.values() for n in (v if isinstance(v, list) else [v])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()
    # Plain shard names only: an index must never lead us to delete other files or leave the folder.
    return {n for n in names if isinstance(n, str) and n == os.path.basename(n) and n.endswith(".weights.h5")}


def write_atomically(filepath: str | os.PathLike[str], write: Callable[[str], None], overwrite: bool = True) -> None:
    """Has ``write`` save under the same name in a new folder beside ``filepath``, then moves what
    it wrote into place. The name must stay: Keras names the shards of a sharded save after it.

    Each file is replaced in one step, so a crash leaves the old file whole, never a half-written
    one. For a sharded save the old index goes first and the new one last, so an index never
    names a mix of old and new shards; shards that only the old index named are then removed.
    With ``overwrite=False``, an existing file is left alone and ``FileExistsError`` raised.
    """
    if not overwrite and os.path.exists(filepath):
        raise exists_error(os.fspath(filepath))
    path = os.path.abspath(os.fspath(filepath))
    directory, name = os.path.split(path)
    os.makedirs(directory, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix=f".{name}.tnt-tmp-", dir=directory)
    try:
        write(os.path.join(tmp_dir, name))
        shards = sorted(f for f in os.listdir(tmp_dir) if f != name)
        stale = shard_names(path) - set(shards) if shards else set()
        if shards and os.path.lexists(path):
            os.remove(path)
        for shard in shards:
            os.replace(os.path.join(tmp_dir, shard), os.path.join(directory, shard))
        os.replace(os.path.join(tmp_dir, name), path)
        for shard in stale:
            try:
                os.remove(os.path.join(directory, shard))
            except FileNotFoundError:
                pass
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def check_weights_path(path: str, sharded: bool) -> None:
    """Refuses, on every rank alike and before writing, a name Keras 3 would refuse or change."""
    stem = path
    for suffix in (".weights.json", ".weights.h5", ".keras", ".h5", ".hdf5"):
        if path.endswith(suffix):
            stem = path[: -len(suffix)]
            break
    if sharded:
        if not path.endswith(".weights.json"):
            raise ValueError(
                "tnt: with max_shard_size, Keras 3 writes a .weights.json index and .weights.h5 shards beside it, "
                f"so the name must end in .weights.json (got {path!r}): save_weights({stem + '.weights.json'!r}, "
                "max_shard_size=...)"
            )
        return
    if path.endswith(".weights.h5"):
        return
    h5 = stem + ".weights.h5"
    if path.endswith(".weights.json"):
        fix = f"a .weights.json file is a sharded save: pass max_shard_size (in GB), or save to {h5!r}"
    elif path.endswith(".keras"):
        fix = f"a .keras file holds the whole model: use save({path!r}), or save_weights({h5!r}) for the weights"
    else:
        fix = f"use save_weights({h5!r})"
    raise ValueError(f"tnt: Keras 3 weights files end in .weights.h5 (got {path!r}); {fix}")


def is_wrapper_file(path: str) -> bool:
    """Whether a ``.keras`` file holds a serialized ``tnt.Model`` (whose weights lie beneath the
    wrapper) rather than a Keras model (as ``tnt.Model.save`` writes)."""
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return False
    return isinstance(config, dict) and config.get("registered_name") == "tnt>Model"
