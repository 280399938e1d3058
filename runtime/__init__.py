"""runtime of hetplan."""
