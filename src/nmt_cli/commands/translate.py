"""`nmt translate` (placeholder until its issue lands)."""

import typer


def register(app: typer.Typer) -> None:
    @app.command("translate", help="(not implemented yet)")
    def _cmd() -> None:
        from nmt_cli.errors import NmtError

        raise NmtError("nmt translate is not implemented yet")
