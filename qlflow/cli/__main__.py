"""`python -m qlflow.cli`: the same as the `qlflow` console script."""

from qlflow.cli.entry import main

main()
