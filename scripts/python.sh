# Sourced by setup.sh, test.sh and main.sh: the one choice of the Python every script runs, in PYTHON.
# $PYTHON if set; else python3, unless that interpreter is externally managed (PEP 668: pip refuses to
# install into Debian 12's and Ubuntu 24.04's system Python), and then a virtual environment, .venv in
# the clone, made from it by setup.sh.
if [ -z "${PYTHON:-}" ]; then
  if python3 -c 'import os, sys, sysconfig
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
sys.exit(0 if managed and sys.prefix == sys.base_prefix else 1)'; then
    PYTHON="$(pwd -P)/.venv/bin/python"
  else
    PYTHON=python3
  fi
fi
export PYTHON
