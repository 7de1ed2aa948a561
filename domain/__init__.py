"""Pure core of qlflow: plan, aggregate fold, decisions and deterministic IDs.

Nothing here does I/O, reads a clock, starts a thread or imports another qlflow
layer. Every function takes facts and returns records, byte for byte the same
for the same input.
"""
