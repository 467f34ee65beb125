"""`nmt prepare` (placeholder until its issue lands)."""

import typer


def register(app: typer.Typer) -> None:
    @app.command("prepare", help="(not implemented yet)")
    def _cmd() -> None:
        from nmt_cli.errors import NmtError

        raise NmtError("nmt prepare is not implemented yet")
