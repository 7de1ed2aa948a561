"""actors layer of qlflow."""
