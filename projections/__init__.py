"""projections layer of qlflow."""
