"""`python -m cli`: the same program as the `gpp` console script."""

from cli.main import main

main()
