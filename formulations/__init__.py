"""formulations of hetplan."""
