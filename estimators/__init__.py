"""estimators of hetplan."""
