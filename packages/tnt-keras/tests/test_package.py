"""tnt-keras is a placeholder until its issue lands: it installs and imports."""

import tnt_keras


def test_package_imports() -> None:
    assert tnt_keras.__doc__ and "Keras" in tnt_keras.__doc__
