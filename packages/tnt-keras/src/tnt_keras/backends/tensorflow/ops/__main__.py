"""``python -m tnt_keras.backends.tensorflow.ops``: prints the path of the op library the ranks will load, building it
into the cache first unless the wheel brought one for this TensorFlow (built at install time).

Run it once per host before a job (or in an image build) so the ranks do not compile at start-up.
"""

from __future__ import annotations

import logging
import sys

from . import _build


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path = _build.prebuilt_path()
        try:
            if not path.exists():
                raise _build.BuildError("the wheel brought no op for this TensorFlow")
            _build.load(path)  # proves the library loads into this TensorFlow
        except _build.BuildError:
            path = _build.build()
            _build.load(path)
    except _build.BuildError as e:
        print(f"tnt_keras: could not build the TensorFlow op: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
