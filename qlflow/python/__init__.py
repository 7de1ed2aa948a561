"""Python Tasks: a function is a step (docs/DESIGN.md, "Python tasks").

`source` checks a Task's function statically at publish (nothing imported),
`context` is what the function receives, `call` runs it and classifies what it
did, `pool` keeps the worker processes of a host, and `executor` runs leased
Attempts of python Tasks under their leases.
"""
