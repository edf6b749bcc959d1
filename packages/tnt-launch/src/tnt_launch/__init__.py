"""tnt-launch: starts, watches and stops the ranks of a tnt training job.

The command is `tnt-launch`: `cli.py` turns its arguments into a configuration, and `job.py` runs
the job, step by step: `hosts` (where; `slurm` for an allocation), `plan` (what each rank gets;
`gpi2` for GPI-2's part), `starters/` (starting the ranks: here, over ssh, or one srun step, each
an agent, `_agent.py`, told what to do by `agents.py`), `supervise` (watching them; `blame` for
the verdict) and `jobs` (the per-host registry behind `--cleanup`).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tnt-launch")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

__all__ = ["__version__"]
