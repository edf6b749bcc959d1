"""tnt-launch: starts, watches and stops the ranks of a tnt training job.

The command is `tnt-launch` (see `cli.py`); the modules follow the steps of a launch: `hosts`
(where), `plan` (what each rank gets), `spawn` (starting agents), `supervise` (watching them) and
`jobs` (the per-host registry behind `--cleanup`).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tnt-launch")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

__all__ = ["__version__"]
