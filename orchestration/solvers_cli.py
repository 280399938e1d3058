"""`hetplan solvers`: which solver back-ends are installed, their versions and capabilities."""
from __future__ import annotations

import json

import typer
from rich.table import Table

_CAPS = [("integer", "MILP"), ("quadratic", "quadratic"), ("nonlinear", "MINLP"),
         ("warm_start", "warm start"), ("partial_warm_start", "partial start"), ("dual_bound", "dual bound")]


def register(app: typer.Typer) -> None:
    """Add the `solvers` command to the hetplan CLI."""

    @app.command("solvers")
    def solvers(as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON.")) -> None:
        """List solver back-ends: available, version, capabilities, note."""
        from hetplan.orchestration.cli import console
        from hetplan.solvers.registry import describe_backends

        rows = describe_backends()
        if as_json:
            typer.echo(json.dumps([r.as_dict() for r in rows], indent=2))
            return
        table = Table(title="hetplan solver back-ends")
        for col in ["name", "available", "version", "capabilities", "note"]:
            table.add_column(col)
        for r in rows:
            caps = ", ".join(label for attr, label in _CAPS if getattr(r.capabilities, attr))
            table.add_row(r.name, "yes" if r.available else "no", r.version or "-", caps, r.note)
        console.print(table)
