"""`python -m xsim`."""

from xsim.cli import main

raise SystemExit(main())
