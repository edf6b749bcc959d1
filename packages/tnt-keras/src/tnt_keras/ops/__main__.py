"""``python -m tnt_keras.ops``: builds the op into the cache (if not there yet) and prints its path.

Run it once per host before a job (or in an image build) so the ranks do not compile at start-up.
"""

from __future__ import annotations

import logging
import sys

from . import _build


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path = _build.build()
        _build.load(path)  # proves the library loads into this TensorFlow
    except _build.BuildError as e:
        print(f"tnt_keras: could not build the TensorFlow op: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
