#!/usr/bin/env bash
# Exit 0 when PYTHON is the interpreter images/lock/cpu-*.txt are locked for (CPython 3.11 on
# linux x86_64: Debian 12's python3, what the images run), else 1.
# Usage: images/bin/lock-fits.sh PYTHON
exec "${1:?usage: images/bin/lock-fits.sh PYTHON}" -c 'import platform, sys
sys.exit(not (sys.implementation.name == "cpython" and sys.version_info[:2] == (3, 11)
              and sys.platform == "linux" and platform.machine() == "x86_64"))'
