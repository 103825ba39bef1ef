"""`python -m xsim`."""

from xsim.cli import entry

entry()
