"""solvers of hetplan."""
