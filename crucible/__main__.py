"""`python -m crucible` is the same as the `llm-engine` console script."""

from crucible.cli import main

raise SystemExit(main())
