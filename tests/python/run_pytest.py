"""CTest's entry to the Python client's tests: pytest with the given arguments, or
exit status 77 (CTest: skipped) when the interpreter lacks pytest or protobuf
(Debian: python3-pytest, python3-protobuf; scripts/setup.sh installs them)."""

import importlib.util
import sys

missing = [name for name in ("pytest", "google.protobuf")
           if importlib.util.find_spec(name.split(".")[0]) is None
           or importlib.util.find_spec(name) is None]
if missing:
    print(f"skipped: {sys.executable} lacks {', '.join(missing)} "
          "(apt-get install python3-pytest python3-protobuf)")
    sys.exit(77)

# Imported once the check above found it (noqa: E402).
import pytest  # noqa: E402

sys.exit(pytest.main(sys.argv[1:]))
