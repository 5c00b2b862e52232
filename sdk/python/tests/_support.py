"""Imports the package from this source tree (installed or not), and keeps
the tests away from this machine's own Shoal settings: no login file, no
node data dir, no SHOAL_* variables but SHOAL_BIN."""

import os
import sys
import tempfile

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, "src"))
if SRC not in sys.path:
    sys.path.insert(0, SRC)

for _key in [k for k in os.environ if k.startswith("SHOAL_") and k != "SHOAL_BIN"]:
    del os.environ[_key]
_NOWHERE = os.path.join(tempfile.gettempdir(), "shoal-py-tests-%d-none" % os.getpid())
os.environ["SHOAL_CLI_CONFIG"] = os.path.join(_NOWHERE, "cli.toml")
os.environ["SHOAL_DATA_DIR"] = os.path.join(_NOWHERE, "data")
