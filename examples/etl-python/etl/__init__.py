"""An example package of python Tasks (see ../README.md)."""
