"""`python -m tfperf` is the `tfperf` command."""

from tfperf.cli import main

raise SystemExit(main())
