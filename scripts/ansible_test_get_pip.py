"""Stand-in for the get-pip.py that ansible-test downloads to put pip into each sanity-test virtualenv.

ansible-test creates every sanity test's virtualenv without pip, then runs
``python get_pip_<version>.py --disable-pip-version-check pip==<version> --no-setuptools --no-wheel``
from ``~/.ansible/test/cache/``, downloading the script from the project's own CI file host when it is not
cached (ansible_test/_util/target/setup/requirements.py: ``bootstrap``). That host is out of reach where the
project is built, so scripts/ansible-sanity.sh puts this file in the cache under that name instead.

It does what get-pip.py does, with the pip that Python ships (``ensurepip``) in place of the copy get-pip.py
embeds: install a pip into this interpreter, then ``pip install --upgrade --force-reinstall`` the requested
packages through pip's ordinary configuration (the package index), leaving out setuptools and wheel when told
to. Standard library only: it runs in the bare virtualenv.
"""

from __future__ import annotations

import subprocess
import sys

# get-pip.py's own options; the rest are pip's (options and requirement specifiers).
SKIP = {"--no-setuptools": "setuptools", "--no-wheel": "wheel"}


def main(argv: list[str]) -> int:
    pip_args = [arg for arg in argv if arg not in SKIP]
    leave_out = [name for flag, name in SKIP.items() if flag in argv]
    python = sys.executable
    subprocess.run([python, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([python, "-m", "pip", "install", "--upgrade", "--force-reinstall", *pip_args], check=True)
    requested = {arg.split("==")[0].lower() for arg in pip_args if not arg.startswith("-")}
    # ensurepip brings setuptools along on Python < 3.12; get-pip.py would not have installed it.
    if unwanted := [name for name in leave_out if name not in requested]:
        subprocess.run(
            [python, "-m", "pip", "uninstall", "--yes", "--disable-pip-version-check", "--quiet", *unwanted],
            check=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
